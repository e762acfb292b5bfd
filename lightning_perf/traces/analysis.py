"""Analyses over the events of torch.profiler Chrome traces, and the names of the trace modules in one place.

The analysis half of the trace code; :mod:`lightning_perf.traces.reader` reads and rewrites the files
(HolisticTraceAnalysis style: parsing kept apart from the analyses that read parsed data):

- parsed data (:mod:`~lightning_perf.traces.spans`): :func:`load_trace`, :class:`Span`, :class:`ParsedTrace`;
- interval arithmetic (:mod:`~lightning_perf.traces.intervals`);
- the Overview breakdown of torch-tb-profiler (:mod:`~lightning_perf.traces.breakdown`): :func:`step_breakdown`;
- here: :func:`kernel_busy_pct` (its "GPU Utilization"), :func:`cpu_operator_stats` and :func:`kernel_stats`;
- the GPU timeline (:mod:`~lightning_perf.traces.gpu_timeline`) and the figures an expert reads
  (:mod:`~lightning_perf.traces.gpu_figures`).

Standard library only; imports nothing from torch or Lightning. Times are in microseconds, as in the trace.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from lightning_perf.traces.breakdown import (
    CATEGORIES,
    CATEGORY_LABELS,
    Breakdown,
    StepBreakdown,
    step_breakdown,
)
from lightning_perf.traces.columns import columns_of
from lightning_perf.traces.intervals import (
    Ranges,
    intersect,
    intersect_ranges,
    merge_ranges,
    ranges_length,
    subtract_ranges,
)
from lightning_perf.traces.intervals import window as intervals_window
from lightning_perf.traces.reader import USER_ANNOTATION_CAT
from lightning_perf.traces.spans import (
    KERNEL_CATS,
    OPERATOR_CATS,
    PROFILER_STEP_PREFIX,
    TIME_TOLERANCE_US,
    ParsedTrace,
    Span,
    StepSpan,
    as_spans,
    load_trace,
    span_of,
    step_spans,
)

__all__ = [
    "CATEGORIES",
    "CATEGORY_LABELS",
    "Breakdown",
    "OperatorStat",
    "ParsedTrace",
    "Ranges",
    "Span",
    "StepBreakdown",
    "StepSpan",
    "cpu_operator_stats",
    "intersect_ranges",
    "kernel_busy_pct",
    "kernel_stats",
    "load_trace",
    "merge_ranges",
    "ranges_length",
    "span_of",
    "step_breakdown",
    "step_spans",
    "subtract_ranges",
]


def kernel_busy_pct(
    events: Iterable[Mapping[str, Any] | Span], window: tuple[float, float] | None = None
) -> float | None:
    """Share (0-100) of ``window`` in which at least one GPU kernel (cat ``kernel``) ran: torch-tb-profiler's
    "GPU Utilization". Kernel intervals are merged (overlaps count once) and clipped to the window, which
    defaults to the first ProfilerStep# start .. the last ProfilerStep# end (the span of all complete events
    when there is no step). None when there are no kernel events."""
    cols = columns_of(events)
    kernels = cols.in_cats(KERNEL_CATS)
    if not kernels.any():
        return None
    if window is None:
        steps = ~kernels & cols.where(
            lambda cat, name: name.startswith(PROFILER_STEP_PREFIX) and not cat.startswith("gpu_")
        )
        chosen = steps if steps.any() else slice(None)  # the extent of all spans, for a trace without steps
        window = (float(cols.start[chosen].min()), float(cols.end[chosen].max()))
        if not window[1] > window[0]:
            return None  # the trace spans no time (zero-length events only): no share to give
    start, end = window
    if not end > start:
        raise ValueError(f"window must be (start, end) with end > start, got {window!r}")
    busy = intersect(cols.merged(kernels), intervals_window(start, end)).length()
    return 100.0 * busy / (end - start)


_START, _END = operator.itemgetter(2), operator.itemgetter(3)  # Span.start, Span.end: C-level getters


def _outer_first(spans: list[Span]) -> None:
    """Sort by start, the longer (enclosing) span first: two stable sorts on C-level float keys give the order
    of the key (start, -end) without a Python call per span."""
    spans.sort(key=_END, reverse=True)  # reverse=True keeps equal ends in their order: still stable
    spans.sort(key=_START)


@dataclass
class OperatorStat:
    name: str
    calls: int
    self_us: float
    total_us: float


def cpu_operator_stats(events: Iterable[Mapping[str, Any] | Span]) -> list[OperatorStat]:
    """Host operators (cpu_op and user_annotation spans, ProfilerStep# excluded) aggregated by name, sorted by
    self time: each span's duration minus its direct children's on the same thread (torch's self_cpu_time)."""
    by_thread: dict[tuple[Any, Any], list[Span]] = defaultdict(list)
    for span in as_spans(events):
        if span.cat in OPERATOR_CATS or span.cat == USER_ANNOTATION_CAT:
            by_thread[span[4:6]].append(span)
    # name -> [calls, self time, total time], in the order the names are first recorded
    totals: dict[str, list[Any]] = {}
    skipped = {name for spans in by_thread.values() for name in {s.name for s in spans}}
    skipped = {name for name in skipped if name.startswith(PROFILER_STEP_PREFIX)}

    def finish(done: Span, self_us: float) -> None:
        # added as each span ends, in that order (the sums' order of additions, their names' first order)
        name = done[0]
        if name in skipped:
            return
        total = totals.get(name)
        if total is None:
            total = totals[name] = [0, 0.0, 0.0]
        total[0] += 1
        total[1] += 0.0 if self_us < 0.0 else self_us  # max(self_us, 0.0)
        total[2] += done[3] - done[2]

    for spans in by_thread.values():
        _outer_first(spans)
        stack: list[list[Any]] = []  # [end, self time, span]
        for span in spans:
            start, end = span[2], span[3]
            limit = start + TIME_TOLERANCE_US
            while stack and stack[-1][0] <= limit:
                _, self_us, done = stack.pop()
                finish(done, self_us)
            duration = end - start
            if stack and end <= stack[-1][0] + TIME_TOLERANCE_US:
                stack[-1][1] -= duration  # a direct child
            stack.append([end, duration, span])
        for _, self_us, done in stack:  # the spans still open at the end, outermost first
            finish(done, self_us)
    stats = [
        OperatorStat(name, calls, self_us, total_us) for name, (calls, self_us, total_us) in totals.items()
    ]
    return sorted(stats, key=lambda s: s.self_us, reverse=True)


def kernel_stats(events: Iterable[Mapping[str, Any] | Span]) -> list[OperatorStat]:
    """GPU kernels aggregated by name, sorted by total time (a kernel's self time is its duration)."""
    cols = columns_of(events)
    kernels = np.flatnonzero(cols.in_cats(KERNEL_CATS))
    codes = cols.name_code[kernels]
    # np.add.at adds in index order, so each name's total is the sum a loop over the kernels makes
    totals = np.zeros(len(cols.names))
    np.add.at(totals, codes, cols.end[kernels] - cols.start[kernels])
    calls = np.bincount(codes, minlength=len(cols.names))
    names, first = np.unique(codes, return_index=True)
    by_first_call = names[np.argsort(first, kind="stable")].tolist()
    stats = [
        OperatorStat(cols.names[code], int(calls[code]), float(totals[code]), float(totals[code]))
        for code in by_first_call
    ]
    return sorted(stats, key=lambda s: s.total_us, reverse=True)
