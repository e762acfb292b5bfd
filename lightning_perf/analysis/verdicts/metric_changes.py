"""Each compared metric's change against the baseline, with its own interval and significance.

Pure. Under repeated, interleaved rounds every tested metric is judged over its per-round values, paired by
round (ratios for times, rates and sizes; differences in points for shares). Single runs are judged from their
per-step samples where those carry the metric: the mean step time and the DataLoader wait's share by batch
means (:mod:`~lightning_perf.analysis.verdicts.mean_intervals`), the throughput through the mean step time;
a metric a single run holds only once (GPU util, CPU) has no interval and is never called better or worse.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from lightning_perf.analysis.numbers import finite as _finite
from lightning_perf.analysis.summary import RunSummary
from lightning_perf.analysis.verdicts.comparison_metrics import MetricSpec
from lightning_perf.analysis.verdicts.mean_intervals import compare_means, compare_shares
from lightning_perf.analysis.verdicts.statistics import (
    NO_DIFFERENCE,
    POINTS,
    RATE,
    MetricChange,
    compare_round_differences,
    compare_rounds,
    verdict_word,
)


def metric_change(
    spec: MetricSpec,
    summaries: Sequence[RunSummary],
    rounds: Sequence[Sequence[RunSummary]] | None,
    baseline: int,
    run: int,
    confidence: float,
) -> MetricChange | None:
    """The change of ``spec``'s metric of run ``run`` against run ``baseline``; None where it cannot be tested."""
    if spec.tested is None:
        return None
    if rounds is not None and min(len(rounds[baseline]), len(rounds[run])) >= 2:
        pairs = [
            (_finite(spec.get(b)), _finite(spec.get(r)))
            for b, r in zip(rounds[baseline], rounds[run], strict=False)
        ]
        measured = [(b, r) for b, r in pairs if b is not None and r is not None]
        if len(measured) >= 2:
            base_values, run_values = [b for b, _ in measured], [r for _, r in measured]
            if spec.tested == POINTS:
                return compare_round_differences(base_values, run_values, confidence)
            return compare_rounds(base_values, run_values, confidence, spec.tested)
    return _from_steps(spec, summaries[baseline], summaries[run], confidence)


def _from_steps(
    spec: MetricSpec, base: RunSummary, run: RunSummary, confidence: float
) -> MetricChange | None:
    """Single runs: the change from the per-step samples, where they carry the metric."""
    if spec.from_steps == "wait_share":
        return compare_shares(
            base.timing.wait_samples_ms,
            base.timing.step_samples_ms,
            run.timing.wait_samples_ms,
            run.timing.step_samples_ms,
            confidence,
        )
    if spec.from_steps not in ("mean", "rate"):
        return None
    time = compare_means(base.timing.step_samples_ms, run.timing.step_samples_ms, confidence)
    if spec.from_steps == "mean" or time is None:
        return time
    return _rate_from_time(spec, base, run, time)


def _rate_from_time(
    spec: MetricSpec, base: RunSummary, run: RunSummary, time: MetricChange
) -> MetricChange | None:
    """Throughput is samples a step over the mean step time: its ratio has the mean's relative interval."""
    base_value, run_value = _finite(spec.get(base)), _finite(spec.get(run))
    if base_value is None or run_value is None or base_value <= 0 or run_value <= 0:
        return None
    if not all(0.0 < x < math.inf for x in (time.ratio, time.low, time.high)):
        return None  # a time change beyond the float range (refused by the comparison): no rate from it
    point = run_value / base_value
    low, high = point * time.ratio / time.high, point * time.ratio / time.low
    separated = low > 1.0 or high < 1.0
    verdict = verdict_word(RATE, point > 1.0) if separated else NO_DIFFERENCE
    method = (
        f"the interval of the mean step time (throughput = samples a step / mean step time); {time.method}"
    )
    return MetricChange(point, low, high, time.confidence, verdict, method, None, RATE)
