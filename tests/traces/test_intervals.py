"""Interval arithmetic (``traces/figures/intervals.py``) against point-by-point set semantics, on Hypothesis' lists."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_perf.traces.figures import intervals
from lightning_perf.traces.figures.intervals import (
    clipped_lengths,
    intersect_ranges,
    merge_ranges,
    ranges_length,
    subtract_ranges,
)

# whole and half units: touching, nested and zero-length intervals are all common
raw_ranges = st.lists(
    st.tuples(st.integers(0, 60), st.integers(0, 12)).map(lambda t: (t[0] / 2, (t[0] + t[1]) / 2)),
    max_size=40,
)
# points between the grid's half units: each lies inside or outside an interval, never on an edge
PROBES = [i / 4 for i in range(1, 2 * 72, 2)]


def covered(ranges) -> set[float]:
    return {p for p in PROBES if any(start < p < end for start, end in ranges)}


def assert_sorted_disjoint(ranges) -> None:
    assert all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:], strict=False))


@settings(max_examples=300, deadline=None)
@given(raw_ranges)
def test_merge_covers_the_same_points_in_sorted_disjoint_ranges(ranges):
    merged = merge_ranges(ranges)
    assert covered(merged) == covered(ranges)
    assert all(a[1] < b[0] for a, b in zip(merged, merged[1:], strict=False))  # touching ones joined
    assert ranges_length(merged) == sum(end - start for start, end in merged)


@settings(max_examples=300, deadline=None)
@given(raw_ranges, raw_ranges)
def test_intersect_and_subtract_are_set_operations(a, b):
    a, b = merge_ranges(a), merge_ranges(b)
    both = intersect_ranges(a, b)
    assert covered(both) == covered(a) & covered(b)
    assert_sorted_disjoint(both)
    rest = subtract_ranges(a, b)
    assert covered(rest) == covered(a) - covered(b)
    assert_sorted_disjoint(rest)


def walk_intersect(a, b):
    """The two-pointer walk the numpy version replaced: the reference for exact equality."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def walk_subtract(a, b):
    out, j = [], 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > start:
                out.append((start, b[k][0]))
            start = max(start, b[k][1])
            k += 1
        if start < end:
            out.append((start, end))
    return out


@settings(max_examples=300, deadline=None)
@given(a=raw_ranges, b=raw_ranges)
def test_the_vectorised_operations_give_the_lists_of_the_loops_they_replaced(a, b):
    a, b = merge_ranges(a), merge_ranges(b)
    assert intersect_ranges(a, b) == walk_intersect(a, b)
    assert intersect_ranges(b, a) == walk_intersect(a, b)
    assert subtract_ranges(a, b) == walk_subtract(a, b)


@settings(max_examples=200, deadline=None)
@given(raw_ranges, st.lists(st.tuples(st.integers(0, 70), st.integers(0, 70)), max_size=5))
def test_clipped_lengths_are_the_lengths_inside_each_window(ranges, windows):
    merged = merge_ranges(ranges)
    starts = np.array([min(w) / 2 for w in windows], dtype=np.float64)
    ends = np.array([max(w) / 2 for w in windows], dtype=np.float64)
    expected = [
        ranges_length(intersect_ranges(merged, [(start, end)])) if end > start else 0.0
        for start, end in zip(starts.tolist(), ends.tolist(), strict=True)
    ]
    assert clipped_lengths(intervals.from_ranges(merged), starts, ends) == pytest.approx(expected)


def test_lengths_are_summed_exactly():
    # fsum: 1e16 + 1.0 + 1.0 loses both ones when added left to right
    spread = intervals.Intervals(np.array([-1e16, 0.0, 2.0]), np.array([0.0, 1.0, 3.0]))
    assert spread.length() == 1e16 + 2.0
