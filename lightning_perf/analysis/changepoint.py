"""Lasting slowdowns in a run's logging windows: a change-point detector cheap enough to run at every window.

The series is one point per logging window (mean step time, DataLoader wait and compute of its steps, the
global step it ended at). :class:`SlowdownDetector` is fed each window as it is logged and answers with a
:class:`Slowdown` when the step time has moved to a lasting higher level:

1. a cheap pre-check on every window: the median of the last :data:`MIN_AFTER` windows is at least
   :data:`MIN_RATIO` times the median of the windows before them (since the start, or the last change);
2. only then the change is located: the best single split of the log step times by least squares
   (``ruptures.Binseg`` with the ``l2`` cost), needing :data:`MIN_BEFORE` windows before it and
   :data:`MIN_AFTER` after (so a burst of one or two slow windows is never "lasting");
3. and confirmed: the ratio of medians after/before is at least :data:`MIN_RATIO`, :data:`LASTING_SHARE` of
   the later windows are each :data:`LASTING_RATIO` times the earlier median or more, they last
   :data:`MIN_LASTING_S` seconds or more, and a one-sided
   Mann-Whitney U test of the window means (``scipy.stats.mannwhitneyu``) rejects "no increase" at
   :data:`ALPHA`. The reported ratio is of step-weighted means, with a 95% percentile-bootstrap interval
   over the windows (the windows are the replicates).

After a change the level it moved to is the new baseline, so a second slowdown later is found too; a speed-up
(the run got faster) only moves the baseline. The series keeps at most :data:`MAX_POINTS` windows: past that,
neighbouring windows are merged pairwise (weighted by their steps), so memory stays flat over days.

False alarms, measured with the generator of ``tests/analysis/test_changepoint.py`` (runs of 300 windows of
>= 1 s, 6% log-normal window noise, a slow random-walk drift, 2% isolated spikes at 1.5-3x): 0 in 1000 runs; with
three two-window bursts at 1.2-1.6x a run added, 3 in 1000 (0.3%). Pure: no torch, no Lightning.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

# A lasting slowdown is at least this much slower (25%): window means of a steady run vary by a few percent
# (tests/analysis/test_changepoint.py measures it); a quarter is well outside that and worth a trace.
MIN_RATIO = 1.25
# Windows of the old level needed before a change can be called: with MIN_AFTER = 3 the smallest one-sided
# Mann-Whitney p-value is 1 / C(11, 3) = 0.006, below ALPHA.
MIN_BEFORE = 5
# Windows of the new level needed to call it lasting (3 logging windows: at least 3 s with the defaults).
MIN_AFTER = 5
# Lasting, not a cluster of spikes: this share of the new level's windows is each at least LASTING_RATIO times
# the old median: all of 5 windows, 9 of 10 (a true 1.25x change with 6% window noise passes ~98% of its
# windows over 1.1x; two-window bursts and isolated spikes do not).
LASTING_SHARE = 0.9
LASTING_RATIO = 1.1
# The old level is judged on at most this many windows before the new one: a local baseline, so slow drift
# over hours (clocks, page cache) does not add up to a "change", and each check costs O(LOOKBACK).
LOOKBACK = 60
# ... and at least this many seconds of training steps: with the default log_min_interval_s (1 s) five windows
# already last 5 s; with log_min_interval_s=0 and millisecond steps, five windows can be a 0.2 s burst of
# another process on the machine, which is noise, not a change of the run.
MIN_LASTING_S = 2.0
# One-sided Mann-Whitney U significance for "the later windows are slower".
ALPHA = 0.01
# The first window holds the first steps (allocator, cudnn autotuning, the first profiler cycle): skipped.
WARMUP_WINDOWS = 1
# Windows kept; beyond it neighbours are merged pairwise (the location's resolution halves, memory stays flat).
MAX_POINTS = 4096
CONFIDENCE = 0.95


@dataclass
class WindowPoint:
    """One logging window: ``steps`` steps ending at global step ``end_step``; mean times in ms."""

    end_step: int
    steps: int
    step_ms: float
    wait_ms: float | None = None
    compute_ms: float | None = None


@dataclass
class Slowdown:
    """A lasting rise of the mean step time from global step ``step`` on (the first slow window's start).

    ``ratio`` is after / before (step-weighted means) with its 95% interval ``low``-``high``; the wait and
    compute means are ``None`` when the DataLoader wait was not measured. ``detected_step`` is the global step
    of the window that confirmed it; ``cycle_batch`` the batch an extra profiler cycle started at, if one did.
    """

    step: int
    before_ms: float
    after_ms: float
    ratio: float
    low: float
    high: float
    p_value: float
    windows_before: int
    windows_after: int
    detected_step: int
    before_wait_ms: float | None = None
    after_wait_ms: float | None = None
    before_compute_ms: float | None = None
    after_compute_ms: float | None = None
    cycle_batch: int | None = None


class SlowdownDetector:
    """Feed it every logging window (:meth:`add`); it answers the slowdowns it confirms, once each."""

    def __init__(self) -> None:
        self.points: list[WindowPoint] = []
        self.slowdowns: list[Slowdown] = []
        self._start = WARMUP_WINDOWS  # index of the first window of the current level

    def add(self, point: WindowPoint) -> Slowdown | None:
        if not (point.steps > 0 and math.isfinite(point.step_ms) and point.step_ms > 0):
            return None
        self.points.append(point)
        if len(self.points) > MAX_POINTS:
            self._coarsen()
        found = self._check()
        if found is not None:
            self.slowdowns.append(found)
        return found

    def _check(self) -> Slowdown | None:
        self._start = max(self._start, len(self.points) - LOOKBACK)
        segment = self.points[self._start :]
        if len(segment) < MIN_BEFORE + MIN_AFTER:
            return None
        times = [p.step_ms for p in segment]
        if statistics.median(times[-MIN_AFTER:]) < MIN_RATIO * statistics.median(times[:-MIN_AFTER]):
            return None  # the common case: one median of a bounded list per window
        split = _best_split(times)
        if len(segment) - split < MIN_AFTER:
            return None  # the new level is too young to call lasting: ask again next window
        before, after = times[:split], times[split:]
        if statistics.median(after) < statistics.median(before):
            self._start += split  # it got faster there: that level is the new baseline
            return self._check()
        base = statistics.median(before)
        if split < MIN_BEFORE or statistics.median(after) < MIN_RATIO * base:
            return None
        if sum(t >= LASTING_RATIO * base for t in after) < LASTING_SHARE * len(after):
            return None
        if sum(p.step_ms * p.steps for p in segment[split:]) < MIN_LASTING_S * 1e3:
            return None
        p_value = _increase_p_value(before, after)
        if p_value >= ALPHA:
            return None
        found = _describe(segment[:split], segment[split:], p_value, self.points[-1].end_step)
        found.step = self.points[self._start + split - 1].end_step
        self._start += split
        return found

    def _coarsen(self) -> None:
        merged = [_merge(self.points[i : i + 2]) for i in range(0, len(self.points), 2)]
        self.points = merged
        self._start //= 2


def _best_split(times: list[float]) -> int:
    """The index that best splits the series into two levels (least squares on the log step times)."""
    import numpy as np
    import ruptures

    signal = np.log(np.asarray(times, dtype=float)).reshape(-1, 1)
    # Binseg with one breakpoint is the exact best single split under the l2 cost, in O(n)
    return int(ruptures.Binseg(model="l2", min_size=1, jump=1).fit(signal).predict(n_bkps=1)[0])


def _increase_p_value(before: list[float], after: list[float]) -> float:
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(after, before, alternative="greater").pvalue)


def _weighted(points: list[WindowPoint], attr: str) -> float | None:
    pairs = [(getattr(p, attr), p.steps) for p in points]
    if any(value is None for value, _ in pairs):
        return None
    total = sum(steps for _, steps in pairs)
    return sum(value * steps for value, steps in pairs) / total


def _describe(before: list[WindowPoint], after: list[WindowPoint], p_value: float, now: int) -> Slowdown:
    before_ms, after_ms = _weighted(before, "step_ms"), _weighted(after, "step_ms")
    assert before_ms is not None and after_ms is not None
    low, high = _ratio_interval(before, after)
    return Slowdown(
        step=0,
        before_ms=before_ms,
        after_ms=after_ms,
        ratio=after_ms / before_ms,
        low=low,
        high=high,
        p_value=p_value,
        windows_before=len(before),
        windows_after=len(after),
        detected_step=now,
        before_wait_ms=_weighted(before, "wait_ms"),
        after_wait_ms=_weighted(after, "wait_ms"),
        before_compute_ms=_weighted(before, "compute_ms"),
        after_compute_ms=_weighted(after, "compute_ms"),
    )


def _ratio_interval(before: list[WindowPoint], after: list[WindowPoint]) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the ratio of step-weighted means, resampling windows."""
    import numpy as np

    # the project's seeded, vectorised scipy.stats.bootstrap (same windows, same interval)
    from lightning_perf.analysis.verdicts.statistics import _percentile_bootstrap

    def arrays(points: list[WindowPoint]) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray([p.step_ms * p.steps for p in points]), np.asarray([float(p.steps) for p in points])

    (b_total, b_steps), (a_total, a_steps) = arrays(before), arrays(after)
    b_index, a_index = np.arange(len(before)), np.arange(len(after))

    def ratio(bi: np.ndarray, ai: np.ndarray, axis: int = -1) -> np.ndarray:
        bi, ai = bi.astype(int), ai.astype(int)
        after_mean = a_total[ai].sum(axis=axis) / a_steps[ai].sum(axis=axis)
        return after_mean / (b_total[bi].sum(axis=axis) / b_steps[bi].sum(axis=axis))

    return _percentile_bootstrap((b_index, a_index), ratio, False, CONFIDENCE)


def _merge(pair: list[WindowPoint]) -> WindowPoint:
    if len(pair) == 1:
        return pair[0]
    steps = sum(p.steps for p in pair)
    return WindowPoint(
        end_step=pair[-1].end_step,
        steps=steps,
        step_ms=_weighted(pair, "step_ms") or 0.0,
        wait_ms=_weighted(pair, "wait_ms"),
        compute_ms=_weighted(pair, "compute_ms"),
    )
