"""Repeated runs of one variant (a trial's rounds): warm-up steps left out, and the rounds pooled into one.

Pure: takes and returns :class:`~lightning_perf.analysis.summary.RunSummary` copies, never changes its input.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Sequence

from lightning_perf.analysis.summary import Distribution, RunSummary
from lightning_perf.analysis.verdicts.mean_intervals import share_interval
from lightning_perf.errors import ConfigError


def without_warmup(summary: RunSummary, warmup_steps: int) -> RunSummary:
    """A copy whose step figures leave out the first ``warmup_steps`` kept samples (caches, allocator, autotune).

    The kept samples are all steps up to ``MAX_SAMPLES``; beyond that they are thinned evenly and the cut is
    approximate. The summary's own figures are kept when too few samples would remain.
    """
    timing = summary.timing
    if warmup_steps <= 0 or len(timing.step_samples_ms) <= warmup_steps + 1:
        return copy.deepcopy(summary)
    steps = timing.step_samples_ms[warmup_steps:]
    waits = (
        timing.wait_samples_ms[warmup_steps:]
        if len(timing.wait_samples_ms) == len(timing.step_samples_ms)
        else []
    )
    return _with_samples(summary, steps, waits)


def pooled(summaries: Sequence[RunSummary]) -> RunSummary:
    """One summary for several rounds of a variant: the step samples of all rounds together.

    Everything that is not a per-step figure (settings, utilization, machine state) comes from the round
    whose mean step time is the median of the rounds'; throughput is the mean of the rounds'.
    """
    if not summaries:
        raise ConfigError("pooled: no summaries to pool")
    means = [s.timing.step_time_ms.mean if s.timing.step_time_ms else float("inf") for s in summaries]
    middle = sorted(range(len(summaries)), key=means.__getitem__)[(len(summaries) - 1) // 2]
    steps = [v for s in summaries for v in s.timing.step_samples_ms]
    same_length = all(len(s.timing.wait_samples_ms) == len(s.timing.step_samples_ms) for s in summaries)
    waits = [v for s in summaries for v in s.timing.wait_samples_ms] if same_length else []
    result = _with_samples(summaries[middle], steps, waits)
    rates = [s.timing.samples_per_sec for s in summaries if s.timing.samples_per_sec is not None]
    result.timing.samples_per_sec = statistics.fmean(rates) if rates else None
    result.timing.steps = sum(s.timing.steps for s in summaries)
    return result


def _with_samples(summary: RunSummary, steps: list[float], waits: list[float]) -> RunSummary:
    result = copy.deepcopy(summary)
    timing = result.timing
    timing.step_samples_ms, timing.wait_samples_ms = list(steps), list(waits)
    if not steps:
        return result
    timing.step_time_ms = Distribution.of(steps)
    if waits and sum(steps) > 0:
        timing.data_wait_ms = Distribution.of(waits)
        timing.compute_ms = Distribution.of([s - w for s, w in zip(steps, waits, strict=True)])
        timing.data_wait_pct = 100.0 * sum(waits) / sum(steps)
        interval = share_interval(waits, steps)
        timing.data_wait_pct_low, timing.data_wait_pct_high = interval if interval else (None, None)
    return result
