"""``lightning-perf tune``: from a diagnosis to a faster, verified setting, on the user's own Lightning project
(a training command, or a config run as the command of our CLI entry: :class:`~lightning_perf.tune.project.Entry`).

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
from dataclasses import dataclass, field
from typing import Any

from lightning_perf.analysis.summary import Finding, RunSummary
from lightning_perf.atomic_file import describe_os_error
from lightning_perf.trial.api import BATCH_SIZES_NOTE
from lightning_perf.trial.compute.figures import RoundFigures, beside, trial_figures
from lightning_perf.trial.decision import (
    METHOD,
    METHOD_PER_SAMPLE,
    Decision,
    Speed,
    choose,
    judge_batch_sizes,
    machine_was_busy,
    speeds_from_trial,
    speeds_of,
    undecided,
)
from lightning_perf.trial.project.terms import InProjectTerms
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
from lightning_perf.trial.spec import (
    DEFAULT_WARMUP_STEPS,
    TrialError,
    TrialResult,
    check_log_dir,
)
from lightning_perf.trial.tuned_config import check_tuned_output
from lightning_perf.tune.project import DIAGNOSIS, Entry
from lightning_perf.yaml_budget import load_yaml

TUNE_SCHEMA_NAME = "lightning-perf/tune"
TUNE_SCHEMA_VERSION = 1
BASELINE = "baseline"
DEFAULT_STEPS = 20
DEFAULT_BUDGET_S = 600.0
# The diagnosis times at least this many steps: the input-bound rule's own minimum for a verdict
# (rules/inputs.py MIN_STEPS_FOR_INPUT_VERDICT: below it, worker start-up weighs on the wait share).
DIAGNOSIS_MIN_STEPS = 20
# Fewest rounds that give an interval at all (one degree of freedom for the paired t-interval).
MIN_ROUNDS = 2
# undecided after the rounds planned, tune runs more, up to this many times as many, while its budget lasts
EXTRA_ROUNDS_FACTOR = 2


@dataclass
class TuneResult:
    """What ``tune`` found, tried and decided. ``decision.winner`` is a candidate's name or None (keep)."""

    config: str
    experiment_dir: str
    findings: list[Finding] = field(default_factory=list)
    candidates: list[Candidate] = field(default_factory=list)
    unapplied: list[Unapplied] = field(default_factory=list)
    speeds: list[Speed] = field(default_factory=list)
    decision: Decision = field(default_factory=lambda: Decision(None, "no verdict", judged=False))
    trial: TrialResult | None = None
    tuned_path: str | None = None
    diff: str = ""
    notes: list[str] = field(default_factory=list)
    rounds: int = 0
    diagnosis_error: str | None = None
    method: str = METHOD  # METHOD_PER_SAMPLE when the variants differ in batch size
    # the tuned config was chosen but could not be written (path and errno): the command fails
    write_error: str | None = None
    # the winner in the project's terms: the tuned config, Hydra overrides and group file, or lines of code
    in_project: InProjectTerms | None = None
    # each variant's mean training loss and compile time over its rounds, shown beside its speed
    figures: dict[str, RoundFigures] = field(default_factory=dict)

    def render(self) -> str:
        lines = [f"tune {self.config}: diagnosis under {os.path.join(self.experiment_dir, DIAGNOSIS)}"]
        if self.diagnosis_error:
            lines.append(f"  the diagnosis fit failed: {self.diagnosis_error}")
        for f in self.findings:
            lines.append(f"  [{f.severity}] {f.id}: {f.title}")
        if self.candidates:
            lines.append("candidates:")
            lines += [
                f"  {c.label}" + (f"  (from {', '.join(c.findings)})" if c.findings else "")
                for c in self.candidates
            ]
        if self.unapplied:
            lines.append("not tried:")
            lines += [f"  {u.finding} ({u.reason}): {u.recommendation}" for u in self.unapplied]
        if self.trial is not None:
            lines.append(self.trial.plan().replace(f"trial {self.trial.name}", "measured"))
            logs = {v.name: v.log_path for v in self.trial.variants if not v.ok and v.log_path}
            lines += [
                f"  {s.describe()}{beside(self.figures, s.name, BASELINE)}"
                + (f" (log: {logs[s.name]})" if s.name in logs else "")
                for s in self.speeds
            ]
            lines.append(f"  method: {self.method}")
        trial_notes = [*self.trial.notes, *disturbance_notes(self.trial.variants)] if self.trial else []
        lines += [f"note: {n}" for n in [*self.notes, *trial_notes]]
        lines.append(f"verdict: {self.decision.line}")
        if self.write_error:
            lines.append(f"error: {self.write_error}")
        if self.tuned_path:
            lines.append(f"wrote {self.tuned_path} (your config is unchanged):")
            lines.append(self.diff.rstrip("\n"))
        others = [
            line
            for line in (self.in_project.lines if self.in_project else [])
            if not self.tuned_path or self.tuned_path not in line
        ]
        if others:
            lines.append("set the winner in your project (your files are unchanged):")
            lines += [f"  {line}" for line in others]
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": TUNE_SCHEMA_NAME,
            "schema_version": TUNE_SCHEMA_VERSION,
            "config": self.config,
            "experiment_dir": self.experiment_dir,
            "diagnosis_error": self.diagnosis_error,
            "findings": [{"id": f.id, "severity": f.severity, "title": f.title} for f in self.findings],
            "candidates": [c.to_dict() for c in self.candidates],
            "not_tried": [u.to_dict() for u in self.unapplied],
            "rounds": self.rounds,
            "speeds": [s.to_dict() for s in self.speeds],
            "figures": {name: f.to_dict() for name, f in self.figures.items()},
            "method": self.method,
            "decision": {
                "winner": self.decision.winner,
                "line": self.decision.line,
                "judged": self.decision.judged,
            },
            "tuned_config": self.tuned_path,
            "write_error": self.write_error,
            "diff": self.diff,
            "in_project": self.in_project.to_dict() if self.in_project else None,
            "notes": list(self.notes),
            "trial": self.trial.to_dict() if self.trial is not None else None,
        }


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
    entry: Entry,
    experiment_dir: str,
    extra: list[tuple[str, list[tuple[str, str]]]],
    allow_semantic: bool,
    overwrite: bool,
) -> None:
    """What can fail the tune without a fit, checked before the first one (raises :class:`TrialError`): the
    config and the variants time something, a batch-size variant is allowed, every output can be written."""
    entry.preflight(extra)
    for own, overrides in extra:
        keys = [key for key, _ in overrides if changes_batch_size(key)]
        if keys and not allow_semantic:
            raise TrialError(
                f"--variant {own!r}: {keys[0]} changes the batch size, a semantic change (it alters what is "
                "learned); pass --allow-semantic-changes to measure it (judged on samples a second)"
            )
    check_log_dir(experiment_dir, "--log-dir/--name")
    if entry.config is not None:
        check_tuned_output(entry.config, overwrite)


def run_tune(
    config: str | None = None,
    steps: int = DEFAULT_STEPS,
    repeats: int = 3,
    budget_s: float | None = DEFAULT_BUDGET_S,
    log_dir: str = "perf_logs",
    name: str | None = None,
    cli: str | None = None,
    allow_semantic: bool = False,
    extra: list[tuple[str, list[tuple[str, str]]]] | None = None,
    warmup_steps: int = DEFAULT_WARMUP_STEPS,
    overwrite: bool = False,
    command: list[str] | None = None,
) -> TuneResult:
    """Diagnose, propose, measure, decide; arguments are checked by the caller (``lightning_perf.cli.tune``),
    what can fail without a fit here, first (:func:`preflight`, raises :class:`TrialError`).

    ``extra``: the user's own candidates (name, overrides), measured with the proposed ones, never combined; one
    that sets the batch size only with ``allow_semantic``. ``overwrite``: replace an existing ``CFG.tuned.yaml``.
    A ``KeyboardInterrupt`` stops the running worker (its process group) and propagates; the rounds done stay
    on disk under the experiment folder.
    """
    started = time.monotonic()
    entry = Entry(config, cli, command)
    name = name or free_experiment(log_dir, entry.stem())
    preflight(entry, os.path.join(log_dir, name), extra or [], allow_semantic, overwrite)
    result = TuneResult(entry.label, os.path.join(log_dir, name))
    # the budget bounds every fit: the diagnosis's, and each measured round's (stopped at it, none after it)
    deadline = None if budget_s is None else started + budget_s
    budget_label = "the budget" if budget_s is None else f"--budget-s {budget_s:g}"
    diag_steps = max(steps, DIAGNOSIS_MIN_STEPS) + warmup_steps
    diag_limits, diag_report = RoundLimits(budget_deadline=deadline, budget_label=budget_label), RoundReport()
    diagnosis = entry.diagnose(diag_steps, log_dir, name, diag_limits, diag_report)
    summary, targets, wall_s = diagnosis.summary, entry.targets(diagnosis), diagnosis.wall_s
    if summary is None:
        result.diagnosis_error = diagnosis.error
        if budget_s is not None and diag_report.stopped == "budget":
            result.notes.append(
                f"the budget (--budget-s {budget_s:g}) is too small for any verdict: the diagnosis fit alone "
                "did not finish in it"
            )
        result.decision = Decision(None, "no verdict: the diagnosis fit failed", judged=False)
        return result
    result.findings = list(summary.findings)
    entry.check_output(diagnosis.facts, overwrite)
    proposal: Proposal = propose(summary.findings, summary.settings, targets, allow_semantic)
    result.candidates, result.unapplied = proposal.candidates, proposal.unapplied
    for own, overrides in extra or []:  # the user's own candidates, renamed where a proposal took the name
        own = own if own not in {c.name for c in result.candidates} else f"{own}_own"
        changes = {key: _yaml_value(value) for key, value in overrides}
        semantic = any(changes_batch_size(key, targets) for key in changes)
        if semantic and not allow_semantic:  # the batch size under a key of the project's own naming
            result.unapplied.append(
                Unapplied(own, own, SEMANTIC_LABEL, "pass --allow-semantic-changes to measure it", changes)
            )
            continue
        label = semantic_label(own) if semantic else own
        result.candidates.append(Candidate(own, label, list(overrides), changes, semantic, ["--variant"]))
    if not result.candidates:
        held = next((f for f in result.findings if f.id == MACHINE_FINDING and f.severity == "high"), None)
        result.decision = (
            machine_was_busy(held.title.lower())  # the diagnosis could not see the run's own needs
            if held is not None
            else Decision(None, "keep your config: the diagnosis found no change to try in the config")
        )
        return result

    warmup_steps, burst_note = burst_warmup(summary.settings, result.candidates, warmup_steps)
    if burst_note:
        result.notes.append(burst_note)
    run_s = _run_estimate(summary, wall_s, diag_steps, steps + warmup_steps)
    left = None if budget_s is None else budget_s - (time.monotonic() - started)
    rounds, kept = plan_rounds(run_s, len(result.candidates) + 1, repeats, left)
    if rounds == 0:
        need = MIN_ROUNDS * 2 * run_s
        result.notes.append(
            f"the budget (--budget-s {budget_s:g}) is too small for any verdict: {left:.0f} s are left after the "
            f"diagnosis, and two rounds of the baseline and one candidate need about {need:.0f} s "
            f"(~{run_s:.0f} s a run); give a larger --budget-s or fewer --steps"
        )
        result.decision = Decision(
            None, "no verdict: the budget is too small; keep your config", judged=False
        )
        return result
    if kept < len(result.candidates) + 1:
        dropped = result.candidates[kept - 1 :]
        result.notes.append(
            f"left out to fit the budget: {', '.join(c.label for c in dropped)} (give a larger --budget-s)"
        )
        result.candidates = result.candidates[: kept - 1]
    if rounds < repeats:
        result.notes.append(f"{rounds} rounds instead of {repeats}, to fit the budget")
    result.rounds = rounds
    variants = [(BASELINE, []), *((c.name, c.overrides) for c in result.candidates)]
    labels = {c.name: c.label for c in result.candidates}
    sizes_differ = any(
        c.semantic and any(changes_batch_size(k) for k in c.changes) for c in result.candidates
    )
    result.trial = entry.trial(
        variants,
        steps,
        log_dir,
        name,
        rounds,
        warmup_steps,
        RoundLimits(
            expected_s=run_s,
            expected_from=f"the diagnosis fit, {wall_s:.0f} s",
            budget_deadline=deadline,
            budget_label=budget_label,
            # rounds until decided: while the best candidate's interval spans 1, up to twice the rounds planned
            undecided=lambda running: undecided(
                speeds_of(running, labels, BASELINE, per_sample=sizes_differ)
            ),
            max_rounds=EXTRA_ROUNDS_FACTOR * rounds,
        ),
    )
    result.rounds = result.trial.repeats  # fewer when the budget ran out (the trial's note says so)
    base = result.trial.variants[0]
    per_sample, barred, notes = judge_batch_sizes(result.trial, result.candidates, BASELINE, allow_semantic)
    result.method, result.notes = METHOD_PER_SAMPLE if per_sample else METHOD, result.notes + notes
    if per_sample:  # tune's own note says how it judged: the trial's advice to compare samples/s goes
        result.trial.notes = [n for n in result.trial.notes if not n.startswith(BATCH_SIZES_NOTE)]
    result.speeds = speeds_from_trial(result.trial, labels, BASELINE, per_sample=per_sample)
    result.figures = trial_figures(result.trial)
    if result.rounds == 0:
        result.decision = Decision(
            None, "no verdict: the budget ran out before a full round; keep your config", judged=False
        )
        return result
    if not base.ok:
        result.decision = Decision(
            None, f"no verdict: the baseline failed ({base.error}); keep your config", judged=False
        )
        return result
    result.decision = choose(
        [s for s in result.speeds if s.name not in barred], disturbance_notes(result.trial.variants)
    )
    winner = next((c for c in result.candidates if c.name == result.decision.winner), None)
    if winner is not None:
        try:
            result.in_project = entry.write(winner.changes, diagnosis.facts, result.experiment_dir, overwrite)
            result.tuned_path, result.diff = result.in_project.tuned_path, result.in_project.diff
        except OSError as err:
            where = err.filename or result.config
            result.write_error = f"could not write the tuned config {where}: {describe_os_error(err)}"
    return result


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


def _yaml_value(text: str) -> Any:
    import yaml

    try:
        return load_yaml(text, f"the value {text!r}")  # checked against the node budget by parse_variant
    except yaml.YAMLError:
        return text
