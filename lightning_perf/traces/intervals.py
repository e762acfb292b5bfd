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
    append = merged.append  # these loops run over every GPU activity of a trace: locals, no builtin calls
    ordered = sorted(ranges)
    if not ordered:
        return merged
    low, high = ordered[0]
    for start, end in ordered:
        if start <= high:
            if end > high:
                high = end
        else:
            append((low, high))
            low, high = start, end
    append((low, high))
    return merged


def intersect_ranges(a: Ranges, b: Ranges) -> Ranges:
    out: Ranges = []
    append = out.append
    i = j = 0
    len_a, len_b = len(a), len(b)
    while i < len_a and j < len_b:
        a_start, a_end = a[i]
        b_start, b_end = b[j]
        start = a_start if a_start >= b_start else b_start  # max() and min(), inline
        end = a_end if a_end <= b_end else b_end
        if start < end:
            append((start, end))
        if a_end < b_end:
            i += 1
        else:
            j += 1
    return out


def subtract_ranges(a: Ranges, b: Ranges) -> Ranges:
    out: Ranges = []
    append = out.append
    j = 0
    len_b = len(b)
    for start, end in a:
        while j < len_b and b[j][1] <= start:
            j += 1
        k = j
        while k < len_b:
            b_start, b_end = b[k]
            if b_start >= end:
                break
            if b_start > start:
                append((start, b_start))
            if b_end > start:
                start = b_end
            k += 1
        if start < end:
            append((start, end))
    return out


def ranges_length(ranges: Iterable[tuple[float, float]]) -> float:
    return math.fsum(end - start for start, end in ranges)


def clipped_length(ranges: Ranges, starts: list[float], start: float, end: float) -> float:
    """Length of sorted disjoint ``ranges`` (whose starts are ``starts``) inside [start, end]."""
    i = max(bisect.bisect_right(starts, start) - 1, 0)
    total = 0.0
    count = len(ranges)
    while i < count:
        low, high = ranges[i]
        if low >= end:
            break
        part = (end if end <= high else high) - (start if start >= low else low)
        if part > 0.0:
            total += part
        i += 1
    return total
