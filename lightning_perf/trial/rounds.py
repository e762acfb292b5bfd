"""The rounds of a trial: every variant once a round, the order rotated each round, the budget's stop, and one
disturbed round run again when the budget allows.

Pure orchestration over a ``run_one`` callable (it fits one round, in this process or in a worker); nothing here
imports Lightning.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from lightning_perf.analysis.run_discovery import load_summary
from lightning_perf.analysis.summary import RunSummary, SummaryError
from lightning_perf.analysis.verdicts.comparison import CompareError
from lightning_perf.analysis.verdicts.rounds import pooled, without_warmup
from lightning_perf.trial.progress import Progress
from lightning_perf.trial.rendering import disturbed_rounds
from lightning_perf.trial.runner import RoundLimits
from lightning_perf.trial.spec import ROUND_DIR, WORKER_LOG_FILENAME, TrialResult, VariantResult

RunOne = Callable[[VariantResult, str, str, Progress], "str | None"]
AGAIN_SUFFIX = "_again"


def _load_round(result: VariantResult, run_dir: str, warmup_steps: int) -> None:
    """Keep a round whose worker finished ok, after checking its summary (a run with no timed step fails)."""
    try:
        summary = load_summary(run_dir, allow_partial=True)
    except (CompareError, SummaryError) as err:
        result.status, result.error = "failed", str(err)
        return
    if summary.timing.steps == 0:
        result.status, result.error = "failed", f"no training step was timed (run status {summary.status!r})"
        return
    result.rounds.append(without_warmup(summary, warmup_steps))


def _mean_ms(summary: RunSummary | None) -> float | None:
    dist = summary.timing.step_time_ms if summary is not None else None
    return dist.mean if dist is not None else None


def round_order(outcomes: list[VariantResult], round_index: int) -> list[tuple[int, VariantResult]]:
    """The variants of round ``round_index`` (from 1), numbered as requested, the order rotated by one each
    round (A B C, B C A, C A B, ...): whatever the first run of a round pays (a cold cache, the previous run's
    clean-up) falls on every variant in turn instead of always on the baseline."""
    numbered = list(enumerate(outcomes, start=1))
    shift = (round_index - 1) % len(numbered)
    return numbered[shift:] + numbered[:shift]


def _run_rounds(
    result: TrialResult,
    outcomes: list[VariantResult],
    run_one: Callable[[VariantResult, str, str, Progress], str | None],
    progress: bool,
    limits: RoundLimits | None = None,
) -> None:
    """Run every variant once a round, ``result.repeats`` rounds (rotated: A B C, B C A, ...), then pool each's.

    ``run_one(outcome, version, run_dir, reporter)`` fits one round, telling ``reporter`` (the progress) its
    steps, and returns ``None`` or a one-line error. A variant whose round fails runs no further rounds. With
    ``limits``, no round starts once their budget is spent, and a round the budget stopped is no failure: the
    trial keeps the rounds every variant ran in full and says so (:func:`_stop_at_budget`).
    """
    result.variants.extend(outcomes)
    total = result.steps + result.warmup_steps
    reporter = Progress(result.repeats, len(outcomes), total, enabled=progress)
    try:
        for round_index in range(1, result.repeats + 1):
            if _run_round(result, outcomes, round_index, run_one, reporter, limits):
                assert limits is not None  # only a budget stops the rounds
                _stop_at_budget(result, outcomes, limits, round_index - 1)
                break
        else:
            if limits is not None:
                _rerun_most_disturbed(result, outcomes, run_one, reporter, limits)
                _rounds_until_decided(result, outcomes, run_one, reporter, limits)
    finally:
        reporter.close()
    for outcome in outcomes:
        if outcome.status != "failed" and len(outcome.rounds) == result.repeats:
            outcome.summary, outcome.status = pooled(outcome.rounds), "ok"


def _run_round(
    result: TrialResult,
    outcomes: list[VariantResult],
    round_index: int,
    run_one: Callable[[VariantResult, str, str, Progress], str | None],
    reporter: Progress,
    limits: RoundLimits | None,
) -> bool:
    """One round of every variant still running; True when the budget stopped it (the round is partial)."""
    total = result.steps + result.warmup_steps
    for index, outcome in round_order(outcomes, round_index):
        if outcome.status == "failed":
            continue
        if limits is not None and limits.exhausted:
            return True
        version = outcome.name if result.repeats == 1 else f"{outcome.name}/{ROUND_DIR.format(round_index)}"
        run_dir = os.path.join(result.experiment_dir, version)
        outcome.round_dirs.append(run_dir)
        reporter.start(round_index, index, outcome.name, total)
        started = time.perf_counter()
        error = run_one(outcome, version, run_dir, reporter)
        if error is not None and outcome.round_reports and outcome.round_reports[-1].stopped == "budget":
            reporter.say(error)  # not the variant's failure: the round is dropped, with the rest of it
            return True
        if error is None:
            _load_round(outcome, run_dir, result.warmup_steps)
        else:
            outcome.status, outcome.error = "failed", error
        wall = time.perf_counter() - started
        outcome.wall_s += wall
        reporter.finished(outcome, wall, _mean_ms(outcome.rounds[-1]) if outcome.status != "failed" else None)
    return False


def _stop_at_budget(
    result: TrialResult, outcomes: list[VariantResult], limits: RoundLimits, done: int
) -> None:
    """The budget is spent after ``done`` full rounds: keep those of every variant, drop the partial round, say
    so; a variant that failed keeps its failure."""
    result.notes.append(limits.budget_note(done, result.repeats))
    result.repeats = done
    for outcome in outcomes:
        if outcome.status == "failed":
            continue
        _drop_rounds_after([outcome], done)
        if outcome.log_path is not None and outcome.round_dirs:  # the last round kept
            outcome.log_path = os.path.join(outcome.round_dirs[-1], WORKER_LOG_FILENAME)
        elif outcome.log_path is not None and not os.path.exists(outcome.log_path):  # never started
            outcome.log_path = None
        if done == 0:
            outcome.status = "failed"
            outcome.error = f"not measured: the budget ({limits.budget_label}) was spent before a full round"


def _rounds_until_decided(
    result: TrialResult,
    outcomes: list[VariantResult],
    run_one: RunOne,
    reporter: Progress,
    limits: RoundLimits,
) -> None:
    """More rounds while ``limits.undecided`` says one could still decide the verdict (an interval that spans 1),
    up to ``limits.max_rounds`` in all and while the budget has time for a whole round; a note says how many
    and why. A round the budget stops is dropped, as any."""
    if limits.undecided is None:
        return
    planned = result.repeats
    while result.repeats < limits.max_rounds:
        running = [o for o in outcomes if o.status != "failed"]
        why = limits.undecided(running) if len(running) > 1 else None
        if why is None:
            break
        need, left = _round_time(limits, running)
        if need > left:
            result.notes.append(
                f"undecided after {result.repeats} rounds ({why}); no time is left for another"
            )
            break
        reporter.add_round()
        reporter.say(f"round {result.repeats + 1}: {why}")
        result.repeats += 1
        if _run_round(result, outcomes, result.repeats, run_one, reporter, limits):
            result.repeats -= 1
            _drop_rounds_after(outcomes, result.repeats)  # the partial round
            break
    if result.repeats > planned:
        still = limits.undecided([o for o in outcomes if o.status != "failed"])
        result.notes.append(
            f"{result.repeats - planned} round(s) beyond the {planned} planned, until the verdict was decided"
            + (f" (still undecided: {still})" if still else "")
        )


def _round_time(limits: RoundLimits, running: list[VariantResult]) -> tuple[float, float]:
    """(seconds one more round of ``running`` takes at the expected pace, seconds of the budget left: infinite
    without a budget)."""
    if limits.budget_deadline is None:
        return 0.0, float("inf")
    return (limits.expected_s or float("inf")) * len(running), limits.budget_deadline - time.monotonic()


def _drop_rounds_after(outcomes: list[VariantResult], kept: int) -> None:
    """Every variant still running keeps its first ``kept`` rounds (a partial round is never judged)."""
    for outcome in outcomes:
        if outcome.status != "failed":
            del outcome.rounds[kept:], outcome.round_dirs[kept:], outcome.round_reports[kept:]


def _rerun_most_disturbed(
    result: TrialResult,
    outcomes: list[VariantResult],
    run_one: RunOne,
    reporter: Progress,
    limits: RoundLimits,
) -> None:
    """Run the round the machine's other work disturbed most once more, every variant, when the budget leaves
    time for it (the expected round time a variant); its figures replace the disturbed ones, and a note says so.
    A rerun that fails keeps the first run. Only once: a machine busy throughout would double every trial."""
    running = [o for o in outcomes if o.status != "failed"]
    counts: dict[int, int] = {}
    for outcome in running:
        for number, _ in disturbed_rounds(outcome):
            if number <= result.repeats:
                counts[number] = counts.get(number, 0) + 1
    if not counts or limits.budget_deadline is None:
        return
    worst = max(counts, key=lambda number: (counts[number], -number))
    need, left = _round_time(limits, running)
    if need > left:
        result.notes.append(
            f"round {worst} was disturbed; not run again: {left:.0f} s of the budget ({limits.budget_label}) "
            f"are left and a round takes about {need:.0f} s"
        )
        return
    again: list[tuple[VariantResult, str, VariantResult]] = []
    for index, outcome in round_order(running, worst):
        version = f"{outcome.name}/{ROUND_DIR.format(worst)}{AGAIN_SUFFIX}"
        run_dir = os.path.join(result.experiment_dir, version)
        reporter.start(worst, index, f"{outcome.name} (again)", result.steps + result.warmup_steps)
        error = run_one(outcome, version, run_dir, reporter)
        report = outcome.round_reports.pop() if len(outcome.round_reports) > result.repeats else None
        fresh = VariantResult(outcome.name, run_dir)
        if error is None:
            _load_round(fresh, run_dir, result.warmup_steps)
        if error is not None or fresh.status == "failed":
            why = error or fresh.error
            result.notes.append(
                f"round {worst} was disturbed; running it again failed ({why}): the first run is kept"
            )
            return
        if report is not None:
            fresh.round_reports.append(report)
        again.append((outcome, run_dir, fresh))
    for outcome, run_dir, fresh in again:
        outcome.rounds[worst - 1], outcome.round_dirs[worst - 1] = fresh.rounds[0], run_dir
        if fresh.round_reports and len(outcome.round_reports) >= worst:
            outcome.round_reports[worst - 1] = fresh.round_reports[0]
        if outcome.log_path is not None:
            outcome.log_path = os.path.join(run_dir, WORKER_LOG_FILENAME)
    still = any(number == worst for o, _, _ in again for number, _ in disturbed_rounds(o))
    result.notes.append(
        f"round {worst} was disturbed by other work on the machine and was run again "
        f"({ROUND_DIR.format(worst)}{AGAIN_SUFFIX})" + ("; the machine was busy then too" if still else "")
    )
