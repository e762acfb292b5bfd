"""Interval arithmetic over sorted, disjoint (start, end) lists, in microseconds.

Hand-written: a few dozen lines over plain tuples, where an interval library would add a dependency for
the same four operations.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable

# ---------------------------------------------------------------------------------------------------------
# Interval arithmetic over sorted, disjoint (start, end) lists
# ---------------------------------------------------------------------------------------------------------

Ranges = list[tuple[float, float]]


def merge_ranges(ranges: Iterable[tuple[float, float]]) -> Ranges:
    """Sorted, disjoint union of intervals (touching ones joined)."""
    merged: Ranges = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def intersect_ranges(a: Ranges, b: Ranges) -> Ranges:
    out: Ranges = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract_ranges(a: Ranges, b: Ranges) -> Ranges:
    out: Ranges = []
    j = 0
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


def ranges_length(ranges: Iterable[tuple[float, float]]) -> float:
    return math.fsum(end - start for start, end in ranges)


def clipped_length(ranges: Ranges, starts: list[float], start: float, end: float) -> float:
    """Length of sorted disjoint ``ranges`` (whose starts are ``starts``) inside [start, end]."""
    i = max(bisect.bisect_right(starts, start) - 1, 0)
    total = 0.0
    while i < len(ranges) and ranges[i][0] < end:
        total += max(0.0, min(end, ranges[i][1]) - max(start, ranges[i][0]))
        i += 1
    return total
