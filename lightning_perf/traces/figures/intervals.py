"""Interval arithmetic over sorted, disjoint intervals, in microseconds, as numpy columns.

:class:`Intervals` holds the starts and the ends of sorted, disjoint intervals (touching and zero-length ones
allowed) in two float64 arrays: the analyses take a trace's spans as columns (:mod:`~lightning_perf.traces.
columns`), so the union of 100,000 kernels is one sort and a running maximum instead of a Python loop. Every
result is made of the input's own values (selections, never arithmetic) and lengths are summed exactly
(:func:`math.fsum`), so the figures do not depend on the order of the work.

The list-of-tuples functions (:func:`merge_ranges` and friends) are the same operations for small inputs and
the tests. Hand-written: four vectorised operations, where an interval library would add a dependency and a
Python object per interval.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from lightning_perf.traces.read.columns import SpanColumns

Ranges = list[tuple[float, float]]
_EMPTY = np.empty(0, dtype=np.float64)


class Intervals(NamedTuple):
    """Sorted, disjoint intervals: ``lo[i] <= hi[i] <= lo[i + 1]``."""

    lo: np.ndarray
    hi: np.ndarray

    def __len__(self) -> int:  # the number of intervals, not the two columns
        return len(self.lo)

    def length(self) -> float:
        """The summed length, exactly rounded (the same whatever the order of the intervals)."""
        return math.fsum((self.hi - self.lo).tolist())

    def as_ranges(self) -> Ranges:
        return list(zip(self.lo.tolist(), self.hi.tolist(), strict=True))


NO_INTERVALS = Intervals(_EMPTY, _EMPTY)


def window(start: float, end: float) -> Intervals:
    return Intervals(np.array([start], dtype=np.float64), np.array([end], dtype=np.float64))


def union_of(cols: SpanColumns, mask: np.ndarray) -> Intervals:
    """The union of the spans of ``mask`` among ``cols``."""
    return merge(cols.start[mask], cols.end[mask])


def merge(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """Union of intervals given by their starts and ends (each end >= its start), touching ones joined."""
    if len(starts) == 0:
        return NO_INTERVALS
    order = np.argsort(starts, kind="stable")
    lo, hi = starts[order], ends[order]
    # an interval starts a new range when it starts after every earlier one ended; since each end >= its start,
    # the running maximum of the ends at a range's last interval is that range's own end
    reach = np.maximum.accumulate(hi)
    breaks = np.flatnonzero(lo[1:] > reach[:-1]) + 1
    firsts = np.concatenate(([0], breaks))
    lasts = np.concatenate((breaks - 1, [len(lo) - 1]))
    return Intervals(lo[firsts], reach[lasts])


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """The parts covered by both: every pair (one of ``a``, one of ``b``) that overlaps by more than a point."""
    if len(a) == 0 or len(b) == 0:
        return NO_INTERVALS
    # for each interval of a, the intervals of b that end after it starts and start before it ends
    first = np.searchsorted(b.hi, a.lo, side="right")
    stop = np.searchsorted(b.lo, a.hi, side="left")
    counts = np.maximum(stop - first, 0)
    total = int(counts.sum())
    if total == 0:
        return NO_INTERVALS
    of_a = np.repeat(np.arange(len(a)), counts)
    # each pair's place among the pairs of its interval of a, added to that interval's first partner in b
    offsets = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    of_b = np.repeat(first, counts) + offsets
    lo = np.maximum(a.lo[of_a], b.lo[of_b])
    hi = np.minimum(a.hi[of_a], b.hi[of_b])
    keep = lo < hi
    return Intervals(lo[keep], hi[keep])


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """The parts of ``a`` that no interval of ``b`` covers: ``a`` intersected with the gaps of ``b``."""
    if len(a) == 0:
        return a
    gaps = Intervals(np.concatenate(([-math.inf], b.hi)), np.concatenate((b.lo, [math.inf])))
    return intersect(a, gaps)


def clipped_lengths(intervals: Intervals, starts: np.ndarray, ends: np.ndarray) -> list[float]:
    """For each window (``starts[i]``, ``ends[i]``), the length of ``intervals`` inside it, the parts added in
    order (as a loop over the intervals would)."""
    totals = []
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        first = int(np.searchsorted(intervals.hi, start, side="right"))
        stop = int(np.searchsorted(intervals.lo, end, side="left"))
        parts = np.minimum(intervals.hi[first:stop], end) - np.maximum(intervals.lo[first:stop], start)
        parts = parts[parts > 0.0]
        totals.append(ordered_sum(parts))
    return totals


def ordered_sum(values: np.ndarray) -> float:
    """The sum of ``values`` added one after the other, as a Python loop adds them (so a figure keeps its last
    bit): ``cumsum`` adds in order, where ``sum()`` adds pairwise."""
    return float(np.cumsum(values)[-1]) if len(values) else 0.0


# ---------------------------------------------------------------------------------------------------------
# The same operations on lists of (start, end) tuples
# ---------------------------------------------------------------------------------------------------------


def _columns(ranges: Iterable[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    pairs = np.array(list(ranges), dtype=np.float64).reshape(-1, 2)
    return pairs[:, 0].copy(), pairs[:, 1].copy()


def from_ranges(ranges: Ranges) -> Intervals:
    """Sorted, disjoint (start, end) tuples as :class:`Intervals`."""
    return Intervals(*_columns(ranges))


def merge_ranges(ranges: Iterable[tuple[float, float]]) -> Ranges:
    """Sorted, disjoint union of intervals (touching ones joined), each with end >= start."""
    return merge(*_columns(ranges)).as_ranges()


def intersect_ranges(a: Ranges, b: Ranges) -> Ranges:
    return intersect(from_ranges(a), from_ranges(b)).as_ranges()


def subtract_ranges(a: Ranges, b: Ranges) -> Ranges:
    return subtract(from_ranges(a), from_ranges(b)).as_ranges()


def ranges_length(ranges: Iterable[tuple[float, float]]) -> float:
    return Intervals(*_columns(ranges)).length()
