"""How ``lightning-perf tune`` reaches a project: a Lightning CLI config (``--config``) or the user's own training
command (``-- COMMAND ARGS...``). Each way diagnoses, measures and writes the winner in its own terms; the
steps between (propose, plan, decide) are the same (:mod:`lightning_perf.trial.tune`).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Any

from lightning_perf.analysis.summary import RunSummary, SummaryError
from lightning_perf.trial.api import run_cli_trial, run_command_trial
from lightning_perf.trial.progress import Progress
from lightning_perf.trial.project.command import (
    FACTS_FILENAME,
    RUNTIME_TARGETS,
    command_text,
    parse_settings,
    run_command_round,
    write_bootstrap,
)
from lightning_perf.trial.project.terms import InProjectTerms, in_project_terms
from lightning_perf.trial.runner import RoundLimits, RoundReport, run_worker, worker_env
from lightning_perf.trial.spec import (
    WORKER_LOG_FILENAME,
    WORKER_MODULE,
    TrialResult,
    check_configs,
    check_timed_settings,
)
from lightning_perf.trial.tuned_config import check_tuned_output, write_tuned

DIAGNOSIS = "diagnosis"
TARGETS_FILENAME = "tune_targets.json"
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

    def preflight(self, extra: list[tuple[str, list[tuple[str, str]]]]) -> None:
        if self.config is not None:
            check_configs([self.config], self.cli)
            check_timed_settings([self.config], extra)
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
        """Where the candidates set each setting: the config's keys, or tune's names applied at run time."""
        return diagnosis.targets if self.config is not None else RUNTIME_TARGETS

    def diagnose(
        self, steps: int, log_dir: str, experiment: str, limits: RoundLimits, report: RoundReport
    ) -> Diagnosis:
        """The diagnosis fit, bounded by ``limits``; ``report`` is filled with what the runner saw."""
        run_dir = os.path.join(log_dir, experiment, DIAGNOSIS)
        os.makedirs(run_dir, exist_ok=True)
        log_path = os.path.join(run_dir, WORKER_LOG_FILENAME)
        side_path = os.path.join(run_dir, TARGETS_FILENAME if self.config is not None else FACTS_FILENAME)
        progress = Progress(1, 1, steps)
        progress.start(1, 1, DIAGNOSIS, steps)
        round_args: dict[str, Any] = {
            "limits": limits,
            "report": report,
            "on_progress": progress.step,
            "on_limit": progress.limit,
        }
        begun = time.perf_counter()
        try:
            if self.config is not None:
                spec = {
                    "configs": [self.config],
                    "overrides": [],
                    "steps": steps,
                    "log_dir": log_dir,
                    "experiment": experiment,
                    "variant": DIAGNOSIS,
                    "version": DIAGNOSIS,
                    "cli": self.cli,
                    "perf_kwargs": DIAGNOSIS_PERF_KWARGS,
                    "targets_path": side_path,
                }
                command = [sys.executable, "-m", WORKER_MODULE]
                error = run_worker(command, json.dumps(spec), log_path, env=worker_env(), **round_args)
            else:
                spec = {
                    "steps": steps,
                    "log_dir": log_dir,
                    "experiment": experiment,
                    "version": DIAGNOSIS,
                    "settings": {},
                    "perf_kwargs": DIAGNOSIS_PERF_KWARGS,
                    "facts_path": side_path,
                }
                site = write_bootstrap(os.path.join(log_dir, experiment))
                error = run_command_round(self.command or [], site, spec, log_path, **round_args)
        finally:
            progress.close()
        wall_s = time.perf_counter() - begun
        if error is not None:
            return Diagnosis(None, {}, {}, wall_s, f"{error} (log: {log_path})")
        try:
            summary = RunSummary.load(run_dir)
            with open(side_path, encoding="utf-8") as fh:
                side = json.load(fh)
        except (SummaryError, OSError, ValueError) as err:
            return Diagnosis(None, {}, {}, wall_s, str(err))
        if self.config is not None:
            return Diagnosis(summary, side, {}, wall_s)
        return Diagnosis(summary, RUNTIME_TARGETS, side, wall_s)

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
        if self.config is not None:
            return run_cli_trial(
                [self.config],
                variants,
                steps,
                log_dir,
                name,
                repeats=rounds,
                warmup_steps=warmup_steps,
                cli=self.cli,
                limits=limits,
            )
        return run_command_trial(
            self.command or [],
            variants,
            steps,
            log_dir,
            name,
            repeats=rounds,
            warmup_steps=warmup_steps,
            limits=limits,
        )

    def write(
        self, changes: dict[str, Any], facts: dict[str, Any], experiment_dir: str, overwrite: bool
    ) -> InProjectTerms:
        """The winner in the project's terms (raises OSError when a file cannot be written)."""
        if self.config is not None:
            path, diff = write_tuned(self.config, changes, overwrite)
            return InProjectTerms("lightning_cli", [], path, diff, files=[path])
        return in_project_terms(facts, changes, experiment_dir, overwrite)
