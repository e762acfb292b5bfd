"""Interval arithmetic over sorted, disjoint (start, end) lists, in microseconds.

Hand-written: a few dozen lines over plain tuples, where an interval library would add a dependency for
the same four operations.
"""

from __future__ import annotations

import bisect
import math
import operator
from collections.abc import Iterable

# ---------------------------------------------------------------------------------------------------------
# Interval arithmetic over sorted, disjoint (start, end) lists
# ---------------------------------------------------------------------------------------------------------

Ranges = list[tuple[float, float]]
# intersect_ranges bisects the longer list when the other is this many times shorter (a window against the
# kernels of a trace): a Python loop over every range costs ~30x a bisection step or a copied range
_FEW_RATIO = 8
_START = operator.itemgetter(0)


def merge_ranges(ranges: Iterable[tuple[float, float]]) -> Ranges:
    """Sorted, disjoint union of intervals (touching ones joined), each with end >= start."""
    merged: Ranges = []
    append = merged.append  # these loops run over every GPU activity of a trace: locals, no builtin calls
    # by start alone: a float key sorts ~2x faster than whole tuples, and the order of intervals with the same
    # start cannot change the union (each one's end >= that start, so the later ones join the same range)
    ordered = sorted(ranges, key=_START)
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
    if len(a) * _FEW_RATIO < len(b):
        return _intersect_few(a, b)
    if len(b) * _FEW_RATIO < len(a):
        return _intersect_few(b, a)
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


def _intersect_few(few: Ranges, many: Ranges) -> Ranges:
    """intersect_ranges when one side is much shorter (a window, the steps): each of its ranges finds its part
    of the other by bisection, and the ranges of ``many`` wholly inside it are copied as they are."""
    out: Ranges = []
    starts = [r[0] for r in many]
    ends = [r[1] for r in many]
    for low, high in few:
        first = bisect.bisect_right(ends, low)  # the first range that ends after low
        stop = bisect.bisect_left(starts, high)  # past the last range that starts before high
        if first >= stop:
            continue
        _append_clipped(out, many[first], low, high)
        if stop - first > 1:
            out.extend(r for r in many[first + 1 : stop - 1] if r[0] < r[1])  # wholly inside: unchanged
            _append_clipped(out, many[stop - 1], low, high)
    return out


def _append_clipped(out: Ranges, interval: tuple[float, float], low: float, high: float) -> None:
    start, end = interval
    start = low if low >= start else start
    end = high if high <= end else end
    if start < end:
        out.append((start, end))


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
    ranges = list(ranges)
    if not ranges:
        return 0.0
    starts, ends = zip(*ranges, strict=True)
    return math.fsum(map(operator.sub, ends, starts))  # each end - start, summed exactly


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
