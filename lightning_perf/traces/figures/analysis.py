"""Analyses over the events of torch.profiler Chrome traces, and the names of the trace modules in one place.

The analysis half of the trace code; :mod:`lightning_perf.traces.read.reader` reads and rewrites the files
(HolisticTraceAnalysis style: parsing kept apart from the analyses that read parsed data):

- parsed data (:mod:`~lightning_perf.traces.read.spans`, :mod:`~lightning_perf.traces.read.loader`): :func:`load_trace`, :class:`Span`, :class:`ParsedTrace`;
- interval arithmetic (:mod:`~lightning_perf.traces.figures.intervals`);
- the Overview breakdown of torch-tb-profiler (:mod:`~lightning_perf.traces.figures.breakdown`): :func:`step_breakdown`;
- here: :func:`kernel_busy_pct` (its "GPU Utilization"), :func:`cpu_operator_stats` and :func:`kernel_stats`;
- the GPU timeline (:mod:`~lightning_perf.traces.figures.gpu_timeline`) and the figures an expert reads
  (:mod:`~lightning_perf.traces.figures.gpu_figures`).

Standard library only; imports nothing from torch or Lightning. Times are in microseconds, as in the trace.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from lightning_perf.errors import ConfigError
from lightning_perf.traces.figures.breakdown import (
    CATEGORIES,
    CATEGORY_LABELS,
    Breakdown,
    StepBreakdown,
    step_breakdown,
)
from lightning_perf.traces.figures.intervals import (
    Ranges,
    intersect,
    intersect_ranges,
    merge_ranges,
    ranges_length,
    subtract_ranges,
    union_of,
)
from lightning_perf.traces.figures.intervals import window as intervals_window
from lightning_perf.traces.read.columns import SpanColumns, columns_of
from lightning_perf.traces.read.loader import load_trace
from lightning_perf.traces.read.reader import USER_ANNOTATION_CAT
from lightning_perf.traces.read.spans import (
    KERNEL_CATS,
    OPERATOR_CATS,
    PROFILER_STEP_PREFIX,
    TIME_TOLERANCE_US,
    ParsedTrace,
    Span,
    StepSpan,
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
        raise ConfigError(f"window must be (start, end) with end > start, got {window!r}")
    busy = intersect(union_of(cols, kernels), intervals_window(start, end)).length()
    return 100.0 * busy / (end - start)


@dataclass
class OperatorStat:
    name: str
    calls: int
    self_us: float
    total_us: float


def cpu_operator_stats(events: Iterable[Mapping[str, Any] | Span]) -> list[OperatorStat]:
    """Host operators (cpu_op and user_annotation spans, ProfilerStep# excluded) aggregated by name, sorted by
    self time: each span's duration minus its direct children's on the same thread (torch's self_cpu_time)."""
    cols = columns_of(events)
    order, threads = cols.nesting_order(cols.in_cats(OPERATOR_CATS | {USER_ANNOTATION_CAT}))
    # the walk gives each span its self time as it ends; the totals are made afterwards, in that order
    finished: list[int] = []
    self_times: list[float] = []
    stack: list[list[Any]] = []  # [end, self time, span index]
    thread = None
    walk = zip(
        order.tolist(), threads.tolist(), cols.start[order].tolist(), cols.end[order].tolist(), strict=True
    )
    for index, span_thread, start, end in walk:
        if span_thread != thread:
            _finish_all(stack, finished, self_times)
            thread = span_thread
        limit = start + TIME_TOLERANCE_US
        while stack and stack[-1][0] <= limit:
            _, self_us, done = stack.pop()
            finished.append(done)
            self_times.append(self_us)
        duration = end - start
        if stack and end <= stack[-1][0] + TIME_TOLERANCE_US:
            stack[-1][1] -= duration  # a direct child
        stack.append([end, duration, index])
    _finish_all(stack, finished, self_times)
    return _operator_totals(cols, np.array(finished, dtype=np.int64), np.array(self_times))


def _finish_all(stack: list[list[Any]], finished: list[int], self_times: list[float]) -> None:
    """The spans still open at the end of a thread, outermost first."""
    for _, self_us, done in stack:
        finished.append(done)
        self_times.append(self_us)
    stack.clear()


def _operator_totals(cols: SpanColumns, finished: np.ndarray, self_times: np.ndarray) -> list[OperatorStat]:
    """Calls, self and total time by name (ProfilerStep# left out), each sum in the order the spans ended,
    the names in the order they first ended; sorted by self time."""
    codes = cols.name_code[finished]
    counted = ~cols.where_name(lambda name: name.startswith(PROFILER_STEP_PREFIX))[finished]
    codes, finished, self_times = codes[counted], finished[counted], self_times[counted]
    self_sums, total_sums = np.zeros(len(cols.names)), np.zeros(len(cols.names))
    np.add.at(self_sums, codes, np.maximum(self_times, 0.0))  # np.add.at adds in index order
    np.add.at(total_sums, codes, cols.end[finished] - cols.start[finished])
    calls = np.bincount(codes, minlength=len(cols.names))
    names, first = np.unique(codes, return_index=True)
    stats = [
        OperatorStat(cols.names[code], int(calls[code]), float(self_sums[code]), float(total_sums[code]))
        for code in names[np.argsort(first, kind="stable")].tolist()
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
