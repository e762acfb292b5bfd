"""Interval arithmetic (``traces/intervals.py``) against point-by-point set semantics, on Hypothesis' lists."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_perf.traces import intervals
from lightning_perf.traces.intervals import (
    clipped_length,
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


@pytest.mark.parametrize("few_ratio", [1, 10**9])
@settings(max_examples=300, deadline=None)
@given(a=raw_ranges, b=raw_ranges)
def test_intersect_by_bisection_gives_the_same_list_as_the_merge_walk(few_ratio, a, b):
    # the bisection path (one side much shorter) and the two-pointer walk: exactly the same list
    a, b = merge_ranges(a), merge_ranges(b)
    expected = intersect_ranges(a, b)
    original = intervals._FEW_RATIO
    intervals._FEW_RATIO = few_ratio
    try:
        assert intersect_ranges(a, b) == expected
        assert intersect_ranges(b, a) == expected
        assert intersect_ranges(a, [b[0]] if b else []) == intersect_ranges([b[0]] if b else [], a)
    finally:
        intervals._FEW_RATIO = original


@settings(max_examples=200, deadline=None)
@given(raw_ranges, st.integers(0, 70), st.integers(0, 70))
def test_clipped_length_is_the_length_inside_the_window(ranges, low, high):
    merged = merge_ranges(ranges)
    start, end = min(low, high) / 2, max(low, high) / 2
    expected = ranges_length(intersect_ranges(merged, [(start, end)])) if end > start else 0.0
    assert clipped_length(merged, [r[0] for r in merged], start, end) == pytest.approx(expected)
