"""The GPU timeline of a trace as HolisticTraceAnalysis defines it: idle, compute and non-compute time.

HTA's ``get_temporal_breakdown`` (hta/analyzers/breakdown_analysis.py, HTA 0.5) looks at every GPU activity
(kernels, memcpy, memset) on all streams of a rank, from the start of the first to the end of the last:

- idle: no GPU activity at all (the gaps of the merged intervals);
- compute: the merged intervals of kernels other than communication and memory kernels;
- non-compute: the rest of the busy time (communication, memcpy, memset not hidden under compute).

HTA leaves out the last profiled step (its parser keeps the GPU work of the runtime calls made before the last
ProfilerStep starts), so :func:`gpu_timeline` counts the GPU work launched from the first step's start to the
last step's start, found through the correlation id of the launching runtime call. GPU activities that no
runtime call of the trace launched (no correlation id, or one no call has: 968 of 3,653 activities of an
activation-checkpointing trace, once left out here; HTA's join on the id drops those whose id no CPU event has)
ran all the same: they are counted where they ran when they were launched in the steps as far as the trace
tells: when they start between the first step's start and the last step's start, or on their stream before work
that was launched in the steps (a stream runs its work in launch order). Not merely while a kernel of the steps
still runs on another stream: on a communication-heavy trace the last counted step's all-reduce runs under the
kernels of the last step, which that rule once counted as the steps' work (less idle, more compute). Those
launched before the first step are left out, as the work of runtime calls made before it: their correlation id
is below that of every call made in the steps (the ids count the runtime calls of the process). On
shared/realtraces this gives HTA's figures to 0.01 point on ``ddp_a100_rank1_of2`` (whose 614 activities without
a call were launched before profiling began) and within 1 point on ``ddp_a100_rank0``, whose sub-microsecond
timestamps HTA reads as whole microseconds (timeunit ns in that trace); we keep them exact.

Standard library and numpy. Times are in microseconds, as in the trace.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from lightning_perf.errors import ConfigError
from lightning_perf.traces.figures.breakdown import before_steps, launch_times
from lightning_perf.traces.figures.intervals import NO_INTERVALS, Intervals, intersect, subtract, union_of
from lightning_perf.traces.figures.intervals import window as intervals_window
from lightning_perf.traces.read.columns import SpanColumns, columns_of
from lightning_perf.traces.read.spans import (
    KERNEL_CATS,
    MEMCPY_CATS,
    MEMSET_CATS,
    RUNTIME_CATS,
    Span,
    StepSpan,
)
from lightning_perf.traces.vendors import is_communication_kernel_name

# HTA's get_kernel_type and torch-tb-profiler's event_parser.py: NCCL kernels are communication (RCCL, the
# ROCm port, keeps the nccl names; gloo moves data with memcpy, not kernels of its own).
GPU_CATS = KERNEL_CATS | MEMCPY_CATS | MEMSET_CATS


@functools.cache  # a few hundred distinct (interned) names against ~1e5 events
def is_communication_kernel(name: str) -> bool:
    return is_communication_kernel_name(name)  # the vendor table (nccl, rccl, msccl) in traces/vendors.py


@dataclass
class GpuTimeline:
    """HTA's temporal breakdown (times in microseconds); the three shares sum to 100."""

    window_us: float
    idle_us: float
    compute_us: float
    non_compute_us: float
    # parts of the busy time, each merged on its own (they may overlap compute)
    communication_us: float
    memcpy_us: float
    memset_us: float
    # profiled steps whose GPU work is counted (all but the last, as HTA)
    steps_counted: int

    def pct(self, part_us: float) -> float:
        return 100.0 * part_us / self.window_us if self.window_us > 0 else 0.0

    @property
    def idle_pct(self) -> float:
        return self.pct(self.idle_us)

    @property
    def compute_pct(self) -> float:
        return self.pct(self.compute_us)

    @property
    def non_compute_pct(self) -> float:
        return self.pct(self.non_compute_us)


def counted_work(cols: SpanColumns, gpu: np.ndarray, first: float, last: float) -> np.ndarray:
    """Mask of the GPU activities of ``gpu`` in HTA's window of steps ``first`` (the first step's start) to
    ``last`` (the last step's start): those launched by a runtime call made in it, and those no call launched
    (no correlation id, or one no call has) that were launched in it as far as the trace tells: started in it,
    or started on their stream before work launched in it did (a stream runs its work in launch order), unless
    their id is below that of every call made from ``first`` on (launched before the steps)."""
    work = np.flatnonzero(gpu)
    calls = cols.in_cats(RUNTIME_CATS) & cols.has_correlation
    launched_at = launch_times(cols, calls, work)
    linked = ~np.isnan(launched_at)
    counted = np.zeros(len(cols), dtype=bool)
    counted[work[linked]] = (launched_at[linked] >= first) & (launched_at[linked] < last)
    orphans = work[~linked]
    if not len(orphans):
        return counted
    start = cols.start[orphans]
    keep = (start >= first) & (start < np.maximum(last, _latest_on_stream(cols, counted, orphans)))
    counted[orphans[keep]] = True
    counted[orphans] &= ~before_steps(cols, counted, first)[orphans]
    return counted


def _latest_on_stream(cols: SpanColumns, counted: np.ndarray, orphans: np.ndarray) -> np.ndarray:
    """For each of ``orphans``, the latest start of the ``counted`` work on its stream (-inf: none). Work
    that started before it on that stream was launched before it: in the steps. (Not the latest end: a long
    collective of the last counted step would take in every kernel of the last step on the other streams.)"""
    latest = np.full(len(orphans), -np.inf)
    chosen = np.flatnonzero(counted)
    if not len(chosen):
        return latest
    streams, starts = cols.thread_code[chosen], cols.start[chosen]
    order = np.lexsort((starts, streams))
    streams, starts = streams[order], starts[order]
    ends = np.flatnonzero(np.append(streams[1:] != streams[:-1], True))  # the last (latest) of each stream
    place = np.searchsorted(streams[ends], cols.thread_code[orphans])
    found = place < len(ends)
    found[found] = streams[ends][place[found]] == cols.thread_code[orphans][found]
    latest[found] = starts[ends][place[found]]
    return latest


def gpu_timeline(spans: Sequence[Span], steps: Sequence[StepSpan]) -> GpuTimeline | None:
    """HTA's idle / compute / non-compute over the GPU work of ``steps`` but the last (:func:`counted_work`; all
    GPU work when there are fewer than two steps or none of it falls in them: a trace without ProfilerStep# or
    without CPU events). None when the trace has no GPU activity."""
    cols = columns_of(spans)
    gpu = cols.in_cats(GPU_CATS)
    counted = len(steps)
    if len(steps) >= 2:
        in_steps = counted_work(cols, gpu, min(s.start for s in steps), max(s.start for s in steps))
        if in_steps.any():
            gpu, counted = in_steps, len(steps) - 1
    if not gpu.any():
        return None
    kernels = gpu & cols.in_cats(KERNEL_CATS)
    communication = kernels & cols.where_name(is_communication_kernel)
    busy = union_of(cols, gpu)
    window = float(busy.hi[-1] - busy.lo[0])
    busy_us, compute_us = busy.length(), union_of(cols, kernels & ~communication).length()
    return GpuTimeline(
        window_us=window,
        idle_us=window - busy_us,
        compute_us=compute_us,
        non_compute_us=max(busy_us - compute_us, 0.0),
        communication_us=union_of(cols, communication).length(),
        memcpy_us=union_of(cols, gpu & cols.in_cats(MEMCPY_CATS)).length(),
        memset_us=union_of(cols, gpu & cols.in_cats(MEMSET_CATS)).length(),
        steps_counted=counted,
    )


def busy_pct(spans: Iterable[Span], window: tuple[float, float], compute_only: bool = False) -> float | None:
    """Share (0-100) of ``window`` in which a kernel ran; ``compute_only`` leaves communication kernels out
    (NCCL waiting for a peer keeps a kernel "running" while the GPU computes nothing). None without kernels."""
    start, end = window
    if not end > start:
        raise ConfigError(f"window must be (start, end) with end > start, got {window!r}")
    cols = columns_of(spans)
    kernels = cols.in_cats(KERNEL_CATS)
    if compute_only:
        kernels &= ~cols.where_name(is_communication_kernel)
    if not kernels.any():
        return None
    return 100.0 * intersect(union_of(cols, kernels), intervals_window(start, end)).length() / (end - start)


def exposed_communication_us(spans: Sequence[Span], window: tuple[float, float]) -> tuple[float, float]:
    """(communication kernel time, the part of it no compute kernel overlaps) inside ``window``."""
    cols = columns_of(spans)
    kernels = cols.in_cats(KERNEL_CATS)
    communication = kernels & cols.where_name(is_communication_kernel)
    comm = intersect(union_of(cols, communication), intervals_window(*window))
    if len(comm) == 0:
        return 0.0, 0.0
    return comm.length(), subtract(comm, union_of(cols, kernels & ~communication)).length()


def idle_ranges(spans: Sequence[Span], window: tuple[float, float]) -> Intervals:
    """The parts of ``window`` with no GPU activity at all."""
    if not window[1] > window[0]:
        return NO_INTERVALS
    cols = columns_of(spans)
    return subtract(intervals_window(*window), union_of(cols, cols.in_cats(GPU_CATS)))


def window_of(steps: Sequence[StepSpan]) -> tuple[float, float] | None:
    if not steps:
        return None
    lo, hi = min(s.start for s in steps), max(s.end for s in steps)
    return (lo, hi) if hi > lo and not math.isinf(lo) else None
