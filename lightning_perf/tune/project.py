"""How ``lightning-perf tune`` reaches a project: the user's own training command (``-- COMMAND ARGS...``) or a
Lightning CLI config (``--config``, built with ``--cli``), which runs as a command too: our Lightning CLI entry
built with the config (:func:`~lightning_perf.trial.project.command.config_command`). Either way one path
diagnoses, measures (the settings applied inside the command at run time) and writes the winner in the project's
terms from what the diagnosis round saw; the steps between (propose, plan, decide) are
:mod:`lightning_perf.tune.run`'s.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from typing import Any

from lightning_perf.analysis.summary import RunSummary, SummaryError
from lightning_perf.trial.api import run_command_trial
from lightning_perf.trial.progress import Progress
from lightning_perf.trial.project.command import (
    FACTS_FILENAME,
    RUNTIME_TARGETS,
    cli_targets,
    command_text,
    config_command,
    parse_settings,
    run_command_round,
    split_overrides,
    write_bootstrap,
)
from lightning_perf.trial.project.terms import InProjectTerms, in_project_terms
from lightning_perf.trial.runner import RoundLimits, RoundReport
from lightning_perf.trial.spec import (
    WORKER_LOG_FILENAME,
    TrialResult,
    check_configs,
    check_timed_settings,
)
from lightning_perf.trial.tuned_config import check_tuned_output

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


@dataclass
class Entry:
    """A config (``config``, built with ``cli``) or a command (``command``): exactly one of the two."""

    config: str | None = None
    cli: str | None = None
    command: list[str] | None = None

    @property
    def label(self) -> str:
        return self.config if self.config is not None else command_text(self.command or [])

    def stem(self) -> str:
        """The experiment's stem: the config's, or the script's (``train.py``, ``-m pkg.train``), or the program's."""
        if self.config is not None:
            return os.path.splitext(os.path.basename(self.config))[0]
        args = self.command or []
        script = next((a for a in args[1:] if a.endswith(".py")), None)
        if script is None and "-m" in args[:-1]:
            script = args[args.index("-m") + 1].rsplit(".", 1)[-1]
        stem = os.path.splitext(os.path.basename(script or args[0]))[0]
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", stem).strip("_.") or "command"

    def run(self) -> list[str]:
        """The command each round runs: the user's, or the config's (our Lightning CLI entry)."""
        if self.config is not None:
            return config_command([self.config], self.cli)
        return list(self.command or [])

    def preflight(self, extra: list[tuple[str, list[tuple[str, str]]]]) -> None:
        if self.config is not None:
            check_configs([self.config], self.cli)
            check_timed_settings([self.config], extra)
            for name, overrides in extra:
                split_overrides(name, overrides, "--variant", config_keys=True)
            return
        for name, overrides in extra:
            parse_settings(name, overrides, "--variant")

    def check_output(self, facts: dict[str, Any], overwrite: bool) -> None:
        """Before the rounds: the tuned config's place takes a file (raises :class:`TrialError`)."""
        config = self.config
        if config is None and facts.get("cli") and facts["cli"].get("configs"):
            config = facts["cli"]["configs"][-1]
        if config is not None:
            check_tuned_output(config, overwrite)

    def targets(self, diagnosis: Diagnosis) -> dict[str, Any]:
        """Where the candidates set each setting: tune's names, applied at run time; a config's CLI adds the keys
        only it holds (the batch size, a recipe's switch, a model's compile argument)."""
        return diagnosis.targets or self._targets_of(diagnosis.facts)

    def _targets_of(self, facts: dict[str, Any]) -> dict[str, Any]:
        return cli_targets(facts.get("cli")) if self.config is not None else RUNTIME_TARGETS

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
                self.run(),
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
        return Diagnosis(summary, self._targets_of(facts), facts, wall_s)

    def trial(
        self,
        variants: list[tuple[str, list[tuple[str, str]]]],
        steps: int,
        log_dir: str,
        name: str,
        rounds: int,
        warmup_steps: int,
        limits: RoundLimits,
    ) -> TrialResult:
        return run_command_trial(
            self.run(),
            variants,
            steps,
            log_dir,
            name,
            repeats=rounds,
            warmup_steps=warmup_steps,
            limits=limits,
            config_keys=self.config is not None,
        )

    def write(
        self, changes: dict[str, Any], facts: dict[str, Any], experiment_dir: str, overwrite: bool
    ) -> InProjectTerms:
        """The winner in the project's terms (raises OSError when a file cannot be written); a config's tuned copy
        is named as the config was given."""
        if self.config is not None and facts.get("cli"):
            facts = {**facts, "cli": {**facts["cli"], "configs": [self.config]}}
        return in_project_terms(facts, changes, experiment_dir, overwrite)
