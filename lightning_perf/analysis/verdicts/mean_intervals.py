"""Intervals for a single run's MEAN step time and DataLoader share, fit for autocorrelated, bursty steps.

What a user waits for is the number of steps times the *mean* step (samples over wall time), so verdicts compare
means. The steps of one run are not independent draws: two DataLoader workers deliver batches in pairs (a long
wait, then a short one), a slow phase lasts several steps. An i.i.d. bootstrap over steps treats each step as a
draw of its own and gives too narrow an interval, and the median of such steps jumps between the modes.

The method here is **non-overlapping batch means** (Schmeiser, "Batch size effects in the analysis of
simulation output", Operations Research 30(3), 1982; Law & Kelton, "Simulation Modeling and Analysis", ch. 9):
the run's steps, in order, are cut into ``k`` contiguous batches; batches several steps long are nearly
independent, so the spread of the ``k`` batch means gives the standard error of the run's mean, with a
Student-t of ``k - 1`` degrees of freedom (``scipy.stats.t``). Two runs' log ratio of means then gets a Welch
interval (delta method for the log, Welch-Satterthwaite degrees of freedom). SciPy offers no block bootstrap
(``scipy.stats.bootstrap`` resamples single observations), and batch means need no resampling at all.

Pure (NumPy and SciPy, imported inside the functions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from lightning_perf.analysis.verdicts.statistics import (
    CONFIDENCE,
    MIN_SAMPLES,
    NO_DIFFERENCE,
    POINTS,
    TIME,
    MetricChange,
    check_confidence,
    log_ratio,
    safe_exp,
    scale_of,
    verdict_word,
)
from lightning_perf.errors import ConfigError

# Batches per run: Schmeiser (1982) finds 10 to 30 batches enough for a valid interval; 10 keeps each batch as
# long as possible (so a burst of a few steps stays inside one batch) at the runs of a few dozen steps a trial
# makes.
BATCHES = 10
# The fewest steps a batch holds: with fewer steps than BATCHES * this, fewer batches are cut.
MIN_BATCH_STEPS = 2

BATCH_MEANS = "batch means"


def _batches(values: Sequence[float]) -> tuple[int, int]:
    """(number of batches, steps per batch) for ``values``: the batches cover the last ``k * b`` steps."""
    count = max(2, min(BATCHES, len(values) // MIN_BATCH_STEPS))
    return count, len(values) // count


def _batch_totals(values: Sequence[float], count: int, size: int) -> list[float]:
    tail = list(values)[len(values) - count * size :]
    return [sum(tail[i * size : (i + 1) * size]) for i in range(count)]


def _mean_and_se(values: Sequence[float]) -> tuple[float, float, int] | None:
    """(mean of all ``values``, its standard error from batch means, degrees of freedom); None below
    :data:`~lightning_perf.analysis.verdicts.statistics.MIN_SAMPLES` values or with a value that is not
    finite. Computed on the values divided by :func:`scale_of` (1.0 for ordinary ones): a step time of
    1e308 ms overflows no sum or square."""
    if len(values) < MIN_SAMPLES or not all(math.isfinite(v) for v in values):
        return None
    scale = scale_of(values)
    scaled = [v / scale for v in values] if scale != 1.0 else values
    count, size = _batches(scaled)
    means = [total / size for total in _batch_totals(scaled, count, size)]
    centre = sum(means) / count
    variance = sum((m - centre) ** 2 for m in means) / (count - 1)
    return scale * (sum(scaled) / len(scaled)), scale * math.sqrt(variance / count), count - 1


def _t(confidence: float, df: float) -> float:
    """Student's t quantile of a two-sided ``confidence`` interval; ValueError naming a confidence outside
    [0.5, 1) (every interval of this module goes through here)."""
    from scipy.stats import t as student_t

    check_confidence(confidence)
    return float(student_t.ppf(0.5 + confidence / 2.0, max(df, 1.0)))


def _welch_df(parts: Sequence[tuple[float, int]]) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of variances ``(variance, df)``."""
    total = sum(v for v, _ in parts)
    denominator = sum(v * v / df for v, df in parts if df > 0)
    return total * total / denominator if denominator > 0 else float(max(df for _, df in parts))


def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """The ``confidence`` interval of the mean of one run's per-step ``values`` by batch means; None below
    ``MIN_SAMPLES`` values."""
    stats = _mean_and_se(values)
    if stats is None:
        return None
    mean, se, df = stats
    half = _t(confidence, df) * se
    return mean - half, mean + half


def describe_method(base_steps: int, other_steps: int) -> str:
    base_batches, other_batches = _batches([0.0] * base_steps)[0], _batches([0.0] * other_steps)[0]
    return (
        f"{BATCH_MEANS}: each run's steps in order cut into {base_batches} and {other_batches} contiguous "
        "batches, whose means give the standard error of the run's mean (steps are autocorrelated and bursty); "
        f"Welch t-interval of the log ratio of the means ({base_steps} vs {other_steps} steps); single run "
        "each: changes of the machine between runs are not covered"
    )


def compare_means(
    baseline: Sequence[float], other: Sequence[float], confidence: float = CONFIDENCE
) -> MetricChange | None:
    """The change of the mean step time between two single runs, from their per-step samples (``kind="time"``).

    ``ratio`` is mean(other) / mean(baseline) with a batch-means interval; a verdict only when the interval
    excludes 1. ``None`` when either run has fewer than ``MIN_SAMPLES`` samples or a non-positive mean.
    """
    base, run = _mean_and_se(baseline), _mean_and_se(other)
    if base is None or run is None or base[0] <= 0 or run[0] <= 0:
        return None
    (base_mean, base_se, base_df), (run_mean, run_se, run_df) = base, run
    try:
        parts = [((base_se / base_mean) ** 2, base_df), ((run_se / run_mean) ** 2, run_df)]
    except OverflowError:  # a spread some 1e154 times the mean: no interval to speak of
        return None
    change = log_ratio(run_mean, base_mean)  # in logs: the quotient of 1e308 and 10 ms stays finite
    half = _t(confidence, _welch_df(parts)) * math.sqrt(sum(v for v, _ in parts))
    low, high = safe_exp(change - half), safe_exp(change + half)
    separated = low > 1.0 or high < 1.0
    verdict = verdict_word(TIME, change > 0) if separated else NO_DIFFERENCE
    method = describe_method(len(baseline), len(other))
    ratio = run_mean / base_mean  # as before where it is a float; from the log where it overflows or vanishes
    ratio = ratio if 0.0 < ratio < math.inf else safe_exp(change)
    return MetricChange(ratio, low, high, confidence, verdict, method, None, TIME)


def _share_and_se(part: Sequence[float], whole: Sequence[float]) -> tuple[float, float, int] | None:
    """(100 * sum(part) / sum(whole), its standard error by batch means of the linearised ratio, df)."""
    if len(part) != len(whole) or len(part) < MIN_SAMPLES:
        return None
    if not all(math.isfinite(v) for v in (*part, *whole)):
        return None
    scale = scale_of([*part, *whole])  # 1.0 for ordinary values; a share is the same scaled
    if scale != 1.0:
        part, whole = [p / scale for p in part], [w / scale for w in whole]
    if sum(whole) <= 0:
        return None
    count, size = _batches(whole)
    parts, wholes = _batch_totals(part, count, size), _batch_totals(whole, count, size)
    share = sum(part) / sum(whole)
    mean_whole = sum(wholes) / count
    # the ratio estimator's linearisation: residuals part_j - share * whole_j, scaled by the mean batch total
    residuals = [(p - share * w) / mean_whole for p, w in zip(parts, wholes, strict=True)]
    centre = sum(residuals) / count
    variance = sum((r - centre) ** 2 for r in residuals) / (count - 1)
    return 100.0 * share, 100.0 * math.sqrt(variance / count), count - 1


def share_interval(
    part: Sequence[float], whole: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float, float] | None:
    """The ``confidence`` interval of one run's share ``100 * sum(part) / sum(whole)`` (the DataLoader wait's
    share of step time) from its paired per-step samples in step order, by batch means; within 0-100. None
    below ``MIN_SAMPLES`` steps. Slow phases last many steps: an i.i.d. bootstrap over such steps covered the
    true share 44-58% of the time for a stated 95%, batch means 84-93% (tests/analysis/test_mean_verdicts.py)."""
    if len(part) != len(whole):
        raise ConfigError(f"share_interval: {len(part)} part samples but {len(whole)} whole samples")
    stats = _share_and_se(part, whole)
    if stats is None:
        return None
    share, se, df = stats
    half = _t(confidence, df) * se
    return max(0.0, share - half), min(100.0, share + half)


def compare_shares(
    base_part: Sequence[float],
    base_whole: Sequence[float],
    other_part: Sequence[float],
    other_whole: Sequence[float],
    confidence: float = CONFIDENCE,
) -> MetricChange | None:
    """The change of a share such as the DataLoader wait's share of step time between two single runs, in
    percentage points (``kind="points"``), with a batch-means Welch interval; ``None`` without enough paired
    per-step samples."""
    base, run = _share_and_se(base_part, base_whole), _share_and_se(other_part, other_whole)
    if base is None or run is None:
        return None
    difference = run[0] - base[0]
    parts = [(base[1] ** 2, base[2]), (run[1] ** 2, run[2])]
    half = _t(confidence, _welch_df(parts)) * math.sqrt(sum(v for v, _ in parts))
    low, high = difference - half, difference + half
    separated = low > 0.0 or high < 0.0
    verdict = verdict_word(POINTS, difference > 0) if separated else NO_DIFFERENCE
    method = f"{BATCH_MEANS} of the share's per-batch sums, Welch t-interval of the difference in points"
    return MetricChange(difference, low, high, confidence, verdict, method, None, POINTS)
