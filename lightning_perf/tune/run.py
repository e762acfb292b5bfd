"""``lightning-perf tune``: from a diagnosis to a faster, verified setting, on the user's own Lightning project
(a training command, or a config run as the command of our CLI entry: a :class:`~lightning_perf.tune.project.Project`).

1. **Diagnose**: a short fit of the command as given, with a PerfCallback (the num_workers probe included), which
   records what the project built, to name the winner in the project's terms.
2. **Propose** (:mod:`~lightning_perf.trial.proposals`): a candidate per settings change the findings ask for,
   plus their combination; changes that need code, that a trial cannot measure or that alter what is learned
   (unless allowed) are listed, never applied.
3. **Measure**: the baseline and the candidates in interleaved, rotated rounds (:func:`run_command_trial`), as
   many rounds as the time budget allows (at least two, or it says the budget is too small). The budget bounds
   every fit: a round still running when it is spent is stopped and dropped, no round starts after it, and
   the rounds every variant ran in full are kept (a note says so); a round that hangs stops at a limit
   derived from the expected round time (:class:`~lightning_perf.trial.runner.RoundLimits`).
4. **Decide and write** (:mod:`~lightning_perf.trial.decision`, :mod:`~lightning_perf.trial.project.terms`): the
   fastest candidate whose speed-up interval lies above 1, written in the project's terms (``CFG.tuned.yaml``
   beside a LightningCLI config), or "keep your config". The user's file is only read. Variants of different
   batch sizes are judged on samples a second; a batch-size change alters what is learned, so it is measured
   only when allowed (``allow_semantic``), the user's own ``--variant`` too, and always labelled so.

Before any fit (:func:`preflight`): the tuned file's folder takes a file, an existing ``CFG.tuned.yaml`` is
replaced only with ``overwrite``, and no setting of the config or of a variant leaves the rounds with nothing
to time (``fast_dev_run``, ``limit_train_batches: 0``...).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lightning_perf.analysis.summary import RunSummary
from lightning_perf.atomic_file import describe_os_error
from lightning_perf.trial.compute.figures import trial_figures
from lightning_perf.trial.decision import (
    METHOD,
    METHOD_PER_SAMPLE,
    Decision,
    choose,
    judge_batch_sizes,
    machine_was_busy,
    speeds_from_trial,
    speeds_of,
    undecided,
)
from lightning_perf.trial.proposals import (
    MACHINE_FINDING,
    SEMANTIC_LABEL,
    Candidate,
    Proposal,
    Unapplied,
    changes_batch_size,
    propose,
    semantic_label,
)
from lightning_perf.trial.rendering import disturbance_notes
from lightning_perf.trial.runner import RoundLimits, RoundReport
from lightning_perf.trial.spec import DEFAULT_WARMUP_STEPS, TrialError, check_log_dir
from lightning_perf.tune.diagnosis import DIAGNOSIS, Diagnosis
from lightning_perf.tune.project import Project, project_of
from lightning_perf.tune.result import BASELINE, TUNE_SCHEMA_NAME, TUNE_SCHEMA_VERSION, TuneResult
from lightning_perf.tune.variants import VariantArg, as_variants

__all__ = [
    "BASELINE",
    "DEFAULT_BUDGET_S",
    "DEFAULT_STEPS",
    "DIAGNOSIS",
    "TUNE_SCHEMA_NAME",
    "TUNE_SCHEMA_VERSION",
    "TuneResult",
    "plan_rounds",
    "preflight",
    "run_tune",
]

DEFAULT_STEPS = 20
DEFAULT_BUDGET_S = 600.0
# The diagnosis times at least this many steps: the input-bound rule's own minimum for a verdict
# (rules/inputs.py MIN_STEPS_FOR_INPUT_VERDICT: below it, worker start-up weighs on the wait share).
DIAGNOSIS_MIN_STEPS = 20
# Fewest rounds that give an interval at all (one degree of freedom for the paired t-interval).
MIN_ROUNDS = 2
# undecided after the rounds planned, tune runs more, up to this many times as many, while its budget lasts
EXTRA_ROUNDS_FACTOR = 2
EXAMPLE = "lightning-perf tune -- python train.py"


@dataclass
class TuneRun:
    """One tune's arguments, shared by its steps; ``started`` on the monotonic clock."""

    project: Project
    steps: int
    repeats: int
    budget_s: float | None
    log_dir: str
    name: str
    allow_semantic: bool
    variants: list[VariantArg]
    warmup_steps: int
    overwrite: bool
    started: float

    @property
    def experiment_dir(self) -> str:
        return os.path.join(self.log_dir, self.name)

    @property
    def deadline(self) -> float | None:
        """The budget bounds every fit: the diagnosis's, and each measured round's (stopped at it, none after it)."""
        return None if self.budget_s is None else self.started + self.budget_s

    @property
    def budget_label(self) -> str:
        return "the budget" if self.budget_s is None else f"--budget-s {self.budget_s:g}"

    @property
    def diagnosis_steps(self) -> int:
        return max(self.steps, DIAGNOSIS_MIN_STEPS) + self.warmup_steps

    def left_s(self) -> float | None:
        return None if self.budget_s is None else self.budget_s - (time.monotonic() - self.started)


@dataclass
class Plan:
    """The measured rounds as planned: how many, their warm-up, a run's expected seconds."""

    rounds: int
    warmup_steps: int
    run_s: float


def plan_rounds(run_s: float, variants: int, repeats: int, budget_left_s: float | None) -> tuple[int, int]:
    """(rounds, variants kept, the baseline counted) that fit the budget at ``run_s`` seconds a run.

    Fewer rounds first (down to :data:`MIN_ROUNDS`), then fewer candidates (the last proposed first);
    ``(0, 0)`` when not even the baseline and one candidate fit twice.
    """
    if budget_left_s is None:
        return repeats, variants
    for kept in range(variants, 1, -1):
        fit = int(budget_left_s // (max(run_s, 1e-9) * kept))
        if fit >= MIN_ROUNDS:
            return min(repeats, fit), kept
    return 0, 0


def free_experiment(log_dir: str, stem: str) -> str:
    """``<stem>_tune``, or ``<stem>_tune_2``, ... : the first name not yet used under ``log_dir``."""
    name, n = f"{stem}_tune", 1
    while os.path.exists(os.path.join(log_dir, name)):
        n += 1
        name = f"{stem}_tune_{n}"
    return name


def preflight(
    project: Project,
    experiment_dir: str,
    variants: Sequence[VariantArg],
    allow_semantic: bool,
    overwrite: bool,
) -> None:
    """What can fail the tune without a fit, checked before the first one (raises :class:`TrialError`): the
    project and the variants time something, a batch-size variant is allowed, every output can be written."""
    project.preflight(variants)
    for variant in variants:
        keys = [key for key in variant.keys if changes_batch_size(key)]
        if keys and not allow_semantic:
            raise TrialError(
                f"--variant {variant.name!r}: {keys[0]} changes the batch size, a semantic change (it alters what "
                "is learned); pass --allow-semantic-changes to measure it (judged on samples a second)"
            )
    check_log_dir(experiment_dir, "--log-dir/--name")
    project.check_output({}, overwrite)


def run_tune(
    config: str | None = None,
    steps: int = DEFAULT_STEPS,
    repeats: int = 3,
    budget_s: float | None = DEFAULT_BUDGET_S,
    log_dir: str = "perf_logs",
    name: str | None = None,
    cli: str | None = None,
    allow_semantic: bool = False,
    extra: Sequence[VariantArg] | Sequence[tuple[str, list[tuple[str, str]]]] | None = None,
    warmup_steps: int = DEFAULT_WARMUP_STEPS,
    overwrite: bool = False,
    command: list[str] | None = None,
) -> TuneResult:
    """Tune a project: diagnose it, propose candidates, measure them in rounds, decide, write the winner.

    Arguments are checked by the caller (``lightning_perf.cli.tune``); what can fail without a fit is checked here
    first (:func:`preflight`). A ``KeyboardInterrupt`` stops the running worker (its process group) and
    propagates; the rounds done stay on disk under the experiment folder.

    Args:
        config: a Lightning CLI YAML config (the config project), or None with ``command``.
        steps: the timed steps of each round.
        repeats: the rounds planned; more run while the verdict is undecided and the budget has time.
        budget_s: the wall-clock budget in seconds of the whole tune, None for none.
        log_dir: the folder the experiment's folder goes in.
        name: the experiment's name; a free one from the project's stem when None.
        cli: the ``LightningCLI`` entry of a config project (``module:function``), None to find it.
        allow_semantic: measure candidates that change what is learned (the batch size).
        extra: the user's own candidates (:class:`~lightning_perf.tune.variants.VariantArg`, or (name, overrides)
            pairs), measured with the proposed ones, never combined.
        warmup_steps: steps fitted before the timed ones in every round.
        overwrite: replace an existing ``CFG.tuned.yaml``.
        command: a training command (the command project, ``python train.py ...``), or None with ``config``.

    Returns:
        The result: the diagnosis, the candidates, the measured speeds, the decision and what was written.

    Raises:
        TrialError: the project cannot run (preflight) or its folder is in the way.
        ConfigError: a config or variant that cannot be read.
    """
    started = time.monotonic()
    project = project_of(config, command, cli, EXAMPLE)
    variants = as_variants(extra)
    name = name or free_experiment(log_dir, project.stem())
    run = TuneRun(
        project,
        steps,
        repeats,
        budget_s,
        log_dir,
        name,
        allow_semantic,
        variants,
        warmup_steps,
        overwrite,
        started,
    )
    preflight(project, run.experiment_dir, variants, allow_semantic, overwrite)
    result = TuneResult(project.label, run.experiment_dir)
    diagnosis = diagnose(run, result)
    if diagnosis is None or not candidates(run, result, diagnosis):
        return result
    plan = plan_measure(run, result, diagnosis)
    if plan is None:
        return result
    measure(run, result, diagnosis, plan)
    winner = decide(run, result)
    if winner is not None:
        write(run, result, diagnosis, winner)
    return result


def diagnose(run: TuneRun, result: TuneResult) -> Diagnosis | None:
    """The diagnosis fit, inside the budget; None (the result says why) when it gave no summary."""
    limits, report = RoundLimits(budget_deadline=run.deadline, budget_label=run.budget_label), RoundReport()
    diagnosis = run.project.diagnose(run.diagnosis_steps, run.log_dir, run.name, limits, report)
    if diagnosis.summary is None:
        result.diagnosis_error = diagnosis.error
        if run.budget_s is not None and report.stopped == "budget":
            result.notes.append(
                f"the budget (--budget-s {run.budget_s:g}) is too small for any verdict: the diagnosis fit alone "
                "did not finish in it"
            )
        result.decision = Decision(None, "no verdict: the diagnosis fit failed", judged=False)
        return None
    result.findings = list(diagnosis.summary.findings)
    run.project.check_output(diagnosis.facts, run.overwrite)
    return diagnosis


def candidates(run: TuneRun, result: TuneResult, diagnosis: Diagnosis) -> bool:
    """The candidates: the findings' proposals, then the user's own; False (the result decided) when none."""
    summary = diagnosis.summary
    assert summary is not None  # diagnose() returned it
    targets = run.project.targets(diagnosis)
    proposal: Proposal = propose(summary.findings, summary.settings, targets, run.allow_semantic)
    result.candidates, result.unapplied = proposal.candidates, proposal.unapplied
    for variant in run.variants:  # the user's own candidates, renamed where a proposal took the name
        own = (
            variant.name if variant.name not in {c.name for c in result.candidates} else f"{variant.name}_own"
        )
        changes = dict(variant.values)
        semantic = any(changes_batch_size(key, targets) for key in changes)
        if semantic and not run.allow_semantic:  # the batch size under a key of the project's own naming
            result.unapplied.append(
                Unapplied(own, own, SEMANTIC_LABEL, "pass --allow-semantic-changes to measure it", changes)
            )
            continue
        label = semantic_label(own) if semantic else own
        result.candidates.append(
            Candidate(own, label, list(variant.overrides), changes, semantic, ["--variant"])
        )
    if result.candidates:
        return True
    held = next((f for f in result.findings if f.id == MACHINE_FINDING and f.severity == "high"), None)
    result.decision = (
        machine_was_busy(held.title.lower())  # the diagnosis could not see the run's own needs
        if held is not None
        else Decision(None, "keep your config: the diagnosis found no change to try in the config")
    )
    return False


def plan_measure(run: TuneRun, result: TuneResult, diagnosis: Diagnosis) -> Plan | None:
    """The rounds that fit what is left of the budget, candidates left out when they do not; None (the result
    says the budget is too small) when not even two rounds of the baseline and one candidate fit."""
    summary = diagnosis.summary
    assert summary is not None
    warmup_steps, burst_note = burst_warmup(summary.settings, result.candidates, run.warmup_steps)
    if burst_note:
        result.notes.append(burst_note)
    run_s = _run_estimate(summary, diagnosis.wall_s, run.diagnosis_steps, run.steps + warmup_steps)
    left = run.left_s()
    rounds, kept = plan_rounds(run_s, len(result.candidates) + 1, run.repeats, left)
    if rounds == 0:
        need = MIN_ROUNDS * 2 * run_s
        result.notes.append(
            f"the budget (--budget-s {run.budget_s:g}) is too small for any verdict: {left:.0f} s are left after "
            f"the diagnosis, and two rounds of the baseline and one candidate need about {need:.0f} s "
            f"(~{run_s:.0f} s a run); give a larger --budget-s or fewer --steps"
        )
        result.decision = Decision(
            None, "no verdict: the budget is too small; keep your config", judged=False
        )
        return None
    if kept < len(result.candidates) + 1:
        dropped = result.candidates[kept - 1 :]
        result.notes.append(
            f"left out to fit the budget: {', '.join(c.label for c in dropped)} (give a larger --budget-s)"
        )
        result.candidates = result.candidates[: kept - 1]
    if rounds < run.repeats:
        result.notes.append(f"{rounds} rounds instead of {run.repeats}, to fit the budget")
    result.rounds = rounds
    return Plan(rounds, warmup_steps, run_s)


def measure(run: TuneRun, result: TuneResult, diagnosis: Diagnosis, plan: Plan) -> None:
    """The baseline and the candidates in interleaved rounds, until decided (while the best candidate's
    interval spans 1, up to :data:`EXTRA_ROUNDS_FACTOR` times the rounds planned) or the budget is spent."""
    variants = [VariantArg(BASELINE), *(VariantArg(c.name, c.overrides) for c in result.candidates)]
    labels = {c.name: c.label for c in result.candidates}
    sizes_differ = any(
        c.semantic and any(changes_batch_size(k) for k in c.changes) for c in result.candidates
    )
    limits = RoundLimits(
        expected_s=plan.run_s,
        expected_from=f"the diagnosis fit, {diagnosis.wall_s:.0f} s",
        budget_deadline=run.deadline,
        budget_label=run.budget_label,
        undecided=lambda running: undecided(speeds_of(running, labels, BASELINE, per_sample=sizes_differ)),
        max_rounds=EXTRA_ROUNDS_FACTOR * plan.rounds,
    )
    result.trial = run.project.trial(
        variants,
        run.steps,
        run.log_dir,
        run.name,
        repeats=plan.rounds,
        warmup_steps=plan.warmup_steps,
        limits=limits,
    )
    result.rounds = result.trial.repeats  # fewer when the budget ran out (the trial's note says so)


def decide(run: TuneRun, result: TuneResult) -> Candidate | None:
    """The speeds (per sample when batch sizes differ) and the verdict; the winning candidate, or None."""
    trial = result.trial
    assert trial is not None  # measure() ran it
    per_sample, barred, notes = judge_batch_sizes(trial, result.candidates, BASELINE, run.allow_semantic)
    result.method, result.notes = METHOD_PER_SAMPLE if per_sample else METHOD, result.notes + notes
    # tune's own note says how it judged: the trial's advice to compare samples/s goes when it did
    trial.judged_per_sample = per_sample
    labels = {c.name: c.label for c in result.candidates}
    result.speeds = speeds_from_trial(trial, labels, BASELINE, per_sample=per_sample)
    result.figures = trial_figures(trial)
    base = trial.variants[0]
    if result.rounds == 0:
        result.decision = Decision(
            None, "no verdict: the budget ran out before a full round; keep your config", judged=False
        )
        return None
    if not base.ok:
        result.decision = Decision(
            None, f"no verdict: the baseline failed ({base.error}); keep your config", judged=False
        )
        return None
    result.decision = choose(
        [s for s in result.speeds if s.name not in barred], disturbance_notes(trial.variants)
    )
    return next((c for c in result.candidates if c.name == result.decision.winner), None)


def write(run: TuneRun, result: TuneResult, diagnosis: Diagnosis, winner: Candidate) -> None:
    """The winner in the project's terms; a file that cannot be written is the result's ``write_error``."""
    try:
        result.in_project = run.project.write(
            winner.changes, diagnosis.facts, result.experiment_dir, run.overwrite
        )
        result.tuned_path, result.diff = result.in_project.tuned_path, result.in_project.diff
    except OSError as err:
        where = err.filename or result.config
        result.write_error = f"could not write the tuned config {where}: {describe_os_error(err)}"


def burst_warmup(settings: Any, candidates: list[Candidate], warmup_steps: int) -> tuple[int, str]:
    """Warm-up steps past every variant's prefetch burst, and a note when that raised them.

    Workers start with ``num_workers x prefetch_factor`` batches in flight: the steps they serve cost no wait, so
    timed steps inside the burst read a many-worker variant faster than it runs (8 workers x 4 = 32 batches against
    23 timed steps read "1.35x faster", truly 1.31x slower)."""
    in_flight = {BASELINE: _in_flight(settings.num_workers, settings.prefetch_factor)}
    for candidate in candidates:
        values = {key.rsplit(".", 1)[-1]: value for key, value in candidate.changes.items()}
        workers = values.get("num_workers", settings.num_workers)
        in_flight[candidate.label] = _in_flight(
            workers, values.get("prefetch_factor", settings.prefetch_factor)
        )
    name, most = max(in_flight.items(), key=lambda item: item[1])
    if most <= warmup_steps:
        return warmup_steps, ""
    return most, (
        f"{most} warm-up steps a round instead of {warmup_steps}: {name} starts with {most} batches in flight "
        "(num_workers x prefetch_factor), and steps served from them would read it faster than it runs"
    )


def _in_flight(workers: Any, prefetch: Any) -> int:
    workers = workers if isinstance(workers, int) and not isinstance(workers, bool) else 0
    prefetch = (
        prefetch if isinstance(prefetch, int) and not isinstance(prefetch, bool) and prefetch > 0 else 2
    )
    return workers * prefetch


def _run_estimate(summary: RunSummary, diag_wall_s: float, diag_steps: int, run_steps: int) -> float:
    """Seconds a measured run takes: the diagnosis's wall time less the steps it ran beyond a measured run's
    (the probe's time stays in: an estimate on the long side keeps the plan inside the budget)."""
    step = summary.timing.step_time_ms
    step_s = step.mean / 1000.0 if step is not None and math.isfinite(step.mean) else 0.0
    return max(diag_wall_s - max(diag_steps - run_steps, 0) * step_s, 1.0)
