"""The diagnosis fit both kinds of project share: their command run once as given, with a PerfCallback (the
num_workers probe included), recording what the project built (its facts), to name the winner in its terms.

:class:`CommandRun` is what the two projects (:mod:`~lightning_perf.tune.config_project`,
:mod:`~lightning_perf.tune.command_project`) have in common: the diagnosis and the rounds of their command; each
says its own command, its targets and whether config keys are its settings.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lightning_perf.analysis.summary import RunSummary, SummaryError
from lightning_perf.trial.api import run_command_trial
from lightning_perf.trial.progress import Progress
from lightning_perf.trial.project.command import FACTS_FILENAME, run_command_round, write_bootstrap
from lightning_perf.trial.runner import RoundLimits, RoundReport
from lightning_perf.trial.spec import DEFAULT_REPEATS, DEFAULT_WARMUP_STEPS, WORKER_LOG_FILENAME, TrialResult
from lightning_perf.tune.variants import VariantArg

DIAGNOSIS = "diagnosis"
# The num_workers probe's cap in the diagnosis. Our choice: the probe's own default budget is 10 s; tune then
# measures the probe's suggestion in full rounds, so a shorter look is enough to find the candidate.
DIAGNOSIS_PROBE_BUDGET_S = 5.0
DIAGNOSIS_PERF_KWARGS = {"probe_num_workers": "auto", "probe_budget_s": DIAGNOSIS_PROBE_BUDGET_S}


@dataclass
class Diagnosis:
    summary: RunSummary | None
    targets: dict[str, Any]
    facts: dict[str, Any]
    wall_s: float
    error: str | None = None


class CommandRun:
    """A project run as a command: the diagnosis and the rounds. Subclasses give :meth:`command`,
    :meth:`targets_of` and ``config_keys`` (a variant may set config keys, given to the CLI after the config)."""

    config_keys = False

    def command(self) -> list[str]:
        raise NotImplementedError

    def targets_of(self, facts: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def targets(self, diagnosis: Diagnosis) -> dict[str, Any]:
        """Where the candidates set each setting: tune's names, applied at run time; a config's CLI adds the keys
        only it holds (the batch size, a recipe's switch, a model's compile argument)."""
        return diagnosis.targets or self.targets_of(diagnosis.facts)

    def diagnose(
        self, steps: int, log_dir: str, experiment: str, limits: RoundLimits, report: RoundReport
    ) -> Diagnosis:
        """The diagnosis fit, bounded by ``limits``; ``report`` is filled with what the runner saw."""
        run_dir = os.path.join(log_dir, experiment, DIAGNOSIS)
        os.makedirs(run_dir, exist_ok=True)
        log_path = os.path.join(run_dir, WORKER_LOG_FILENAME)
        side_path = os.path.join(run_dir, FACTS_FILENAME)
        progress = Progress(1, 1, steps)
        progress.start(1, 1, DIAGNOSIS, steps)
        spec = {
            "steps": steps,
            "log_dir": log_dir,
            "experiment": experiment,
            "version": DIAGNOSIS,
            "settings": {},
            "perf_kwargs": DIAGNOSIS_PERF_KWARGS,
            "facts_path": side_path,
        }
        begun = time.perf_counter()
        try:
            site = write_bootstrap(os.path.join(log_dir, experiment))
            error = run_command_round(
                self.command(),
                site,
                spec,
                log_path,
                limits=limits,
                report=report,
                on_progress=progress.step,
                on_limit=progress.limit,
            )
        finally:
            progress.close()
        wall_s = time.perf_counter() - begun
        if error is not None:
            return Diagnosis(None, {}, {}, wall_s, f"{error} (log: {log_path})")
        try:
            summary = RunSummary.load(run_dir)
            with open(side_path, encoding="utf-8") as fh:
                facts = json.load(fh)
        except (SummaryError, OSError, ValueError) as err:
            return Diagnosis(None, {}, {}, wall_s, str(err))
        return Diagnosis(summary, self.targets_of(facts), facts, wall_s)

    def trial(
        self,
        variants: Sequence[VariantArg],
        steps: int,
        log_dir: str,
        name: str,
        *,
        repeats: int = DEFAULT_REPEATS,
        warmup_steps: int = DEFAULT_WARMUP_STEPS,
        limits: RoundLimits | None = None,
        timeout_s: float | None = None,
    ) -> TrialResult:
        """The variants' interleaved rounds (:func:`~lightning_perf.trial.api.run_command_trial`)."""
        return run_command_trial(
            self.command(),
            [variant.pair for variant in variants],
            steps,
            log_dir,
            name,
            timeout_s=timeout_s,
            repeats=repeats,
            warmup_steps=warmup_steps,
            limits=limits,
            config_keys=self.config_keys,
        )
