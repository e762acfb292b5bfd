"""The figures a performance engineer reads off a GPU trace, as :class:`~lightning_perf.analysis.trace_figures.
TraceFigures` for the pure trace rules.

:func:`trace_figures` reads one parsed trace once: the Overview breakdown (torch-tb-profiler), the GPU
timeline (HolisticTraceAnalysis), kernels per step and their durations, communication and the part of it no
compute overlaps, blocking runtime calls with the operator that issued them, copies by kind and memory,
tensor-core use, and the allocator's growth per step.

Standard library and numpy. Times in the trace are microseconds; the figures are per step in milliseconds.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from lightning_perf.analysis.numbers import BYTES_PER_GB, BYTES_PER_MB
from lightning_perf.analysis.trace_figures import BlockingCall, MemcpyKind, TraceFigures
from lightning_perf.traces.figures.breakdown import CATEGORIES, Breakdown, step_breakdown
from lightning_perf.traces.figures.gpu_timeline import (
    busy_pct,
    exposed_communication_us,
    gpu_timeline,
    idle_ranges,
    window_of,
)
from lightning_perf.traces.figures.host_calls import (
    blocking_calls,
    blocking_mask,
    in_host_steps,
    issuing_operators,
)
from lightning_perf.traces.figures.intervals import Intervals, intersect, subtract, union_of
from lightning_perf.traces.figures.tensor_cores import (  # noqa: F401 (re-exported: read from here too)
    TENSOR_CORE_ELIGIBLE,
    TRITON_PREFIX,
    is_tensor_core_eligible,
    tensor_core_figures,
)
from lightning_perf.traces.read.columns import SpanColumns, columns_of
from lightning_perf.traces.read.columns import host_steps as steps_of_host
from lightning_perf.traces.read.reader import is_dataloader_span
from lightning_perf.traces.read.spans import (
    KERNEL_CATS,
    MEMCPY_CATS,
    OPERATOR_CATS,
    RUNTIME_CATS,
    ParsedTrace,
    Span,
    StepSpan,
    gc_paused,
)
from lightning_perf.traces.vendors import (
    NVIDIA_TENSOR_CORE_MARKERS,
    is_launch_call,
    is_matrix_core_kernel,
)

# Kernels shorter than this are "tiny": launching one costs the host about 5-10 us (NVIDIA, "Getting Started
# with CUDA Graphs": launch overheads of a few microseconds), so a GPU fed by them waits for launches.
SMALL_KERNEL_US = 10.0
# Which kernels run on matrix cores (NVIDIA tensor cores, AMD MFMA): traces/vendors.py's tables, as the
# fallback of the precision the operators computed in (traces/figures/tensor_cores.py).
TENSOR_CORE_MARKERS = NVIDIA_TENSOR_CORE_MARKERS
uses_tensor_cores = is_matrix_core_kernel
_US_PER_MS = 1000.0


@gc_paused()
def trace_figures(parsed: ParsedTrace, breakdown: Breakdown | None = None) -> TraceFigures:
    """All figures of one trace (see :class:`TraceFigures`); a CPU-only trace fills the host ones only.
    ``breakdown``: the trace's :func:`step_breakdown` when the caller has it already."""
    spans = parsed.columns  # the spans as columns: no analysis here needs the span tuples
    figures = TraceFigures(source=parsed.path, rank=parsed.rank)
    _device(figures, parsed)
    breakdown = step_breakdown(spans) if breakdown is None else breakdown
    steps = [StepSpan(s.step or 0, s.start, s.end) for s in breakdown.steps]
    host_steps = steps_of_host(spans)
    window = window_of(steps)
    average = breakdown.average()
    if not steps or window is None:
        return figures
    n = len(steps)
    figures.steps = n
    figures.step_ms = average["total"] / _US_PER_MS
    figures.breakdown_pct = {c: 100.0 * average[c] / average["total"] for c in CATEGORIES}
    figures.dataloader_pct = figures.breakdown_pct["dataloader"]
    if breakdown.dataloader_host_us is not None:
        figures.dataloader_call_ms = breakdown.dataloader_host_us / _US_PER_MS
    figures.steps_ms = [{c: s.categories[c] / _US_PER_MS for c in CATEGORIES} for s in breakdown.steps]
    figures.step_numbers = [s.step for s in breakdown.steps]
    # every figure reads the whole span list through its columns (made once): the GPU activities and runtime
    # calls are picked out by category inside each
    timeline = gpu_timeline(spans, host_steps)
    if timeline is None:
        return figures
    figures.idle_pct, figures.compute_pct = timeline.idle_pct, timeline.compute_pct
    figures.non_compute_pct = timeline.non_compute_pct
    figures.kernel_busy_pct = busy_pct(spans, window)
    figures.compute_busy_pct = busy_pct(spans, window, compute_only=True)
    idle = idle_ranges(spans, window)
    figures.step_idle_pct = 100.0 * idle.length() / (window[1] - window[0])
    inner_index: dict[int, int] = {}  # each runtime call's innermost operator, for its input types
    issuers = issuing_operators(spans, inner_index)
    blocking = blocking_mask(columns_of(spans))  # for the idle shares and the blocking-call table
    figures.host_during_idle_pct = _host_during_idle(spans, idle, blocking)
    _kernels(figures, spans, window, n)
    _host(figures, spans, host_steps, n, issuers, blocking)
    comm, exposed = exposed_communication_us(spans, window)
    figures.communication_ms_per_step = comm / n / _US_PER_MS
    figures.exposed_communication_ms_per_step = exposed / n / _US_PER_MS
    _copies(figures, spans, window, n)
    tensor_core_figures(figures, spans, window, issuers, inner_index)
    _memory(figures, parsed, steps)
    return figures


def _device(figures: TraceFigures, parsed: ParsedTrace) -> None:
    props = parsed.device_properties
    if not props:
        return
    first = props[0]
    figures.device_name = first.get("name") if isinstance(first.get("name"), str) else None
    major, minor = first.get("computeMajor"), first.get("computeMinor")
    if isinstance(major, int) and isinstance(minor, int):
        figures.compute_capability = [major, minor]
    total = first.get("totalGlobalMem")
    if isinstance(total, (int, float)) and total > 0:
        figures.memory_capacity_gb = total / BYTES_PER_GB


def _inside(cols: SpanColumns, window: tuple[float, float]) -> np.ndarray:
    """Mask of the spans that start inside ``window``."""
    return (cols.start >= window[0]) & (cols.start < window[1])


def _durations(cols: SpanColumns, mask: np.ndarray) -> list[float]:
    return (cols.end[mask] - cols.start[mask]).tolist()


def _kernels(figures: TraceFigures, spans: Sequence[Span], window: tuple[float, float], n: int) -> None:
    cols = columns_of(spans)
    durations = sorted(_durations(cols, cols.in_cats(KERNEL_CATS) & _inside(cols, window)))
    if not durations:
        return
    total = sum(durations)
    small = [d for d in durations if d < SMALL_KERNEL_US]
    figures.kernels_per_step = len(durations) / n
    figures.kernel_ms_per_step = total / n / _US_PER_MS
    figures.kernel_median_us = statistics.median(durations)
    figures.small_kernel_count_pct = 100.0 * len(small) / len(durations)
    figures.small_kernel_time_pct = 100.0 * sum(small) / total if total > 0 else 0.0


def _host(
    figures: TraceFigures,
    spans: Sequence[Span],
    host_steps: Sequence[StepSpan],
    n: int,
    issuers: dict[int, Any],
    blocking: np.ndarray,
) -> None:
    cols = columns_of(spans)
    launches = cols.in_cats(RUNTIME_CATS) & cols.where_name(is_launch_call)
    if host_steps:  # without ProfilerStep# spans (an inference loop) the one step is the whole trace
        launches &= in_host_steps(cols, host_steps)
    figures.launches_per_step = int(launches.sum()) / n
    figures.launch_ms_per_step = sum(_durations(cols, launches)) / n / _US_PER_MS
    figures.blocking = [
        BlockingCall(b.name, b.operator, b.calls, b.total_us / n / _US_PER_MS)
        for b in blocking_calls(spans, host_steps, issuers, blocking)
    ]
    figures.blocking_ms_per_step = sum(b.ms_per_step for b in figures.blocking)


# The host's activities while the GPU idles, in the order a moment of idle time is given to the first that applies.
_HOST_KINDS = ("blocking call", "DataLoader", "runtime call", "CPU operators")


def _host_during_idle(spans: Sequence[Span], idle: Intervals, blocking: np.ndarray) -> dict[str, float]:
    """Share of the GPU's idle time in which the host was in each activity, the first that applies in the order
    blocking call, DataLoader, kernel launch or other runtime call, CPU operator; else "other". ``blocking``:
    the :func:`blocking_mask` of the spans."""
    total = idle.length()
    if total <= 0:
        return {}
    cols = columns_of(spans)
    runtime = cols.in_cats(RUNTIME_CATS)
    kind = cols.classify(_host_kind)
    kinds = {
        "blocking call": blocking,
        "DataLoader": ~runtime & (kind == _DATALOADER),
        "runtime call": runtime & ~blocking,
        "CPU operators": ~runtime & (kind == _CPU_OPERATOR),
    }
    shares: dict[str, float] = {}
    rest = idle
    for name in _HOST_KINDS:
        covered = intersect(rest, union_of(cols, kinds[name]))
        shares[name] = 100.0 * covered.length() / total
        rest = subtract(rest, covered)
    shares["other"] = 100.0 * rest.length() / total
    return shares


_OTHER, _DATALOADER, _CPU_OPERATOR = range(3)


def _host_kind(cat: str, name: str) -> int:
    if is_dataloader_span(name) and not cat.startswith("gpu_"):
        return _DATALOADER
    if cat in OPERATOR_CATS and not name.startswith("ProfilerStep#"):
        return _CPU_OPERATOR
    return _OTHER


def _copies(figures: TraceFigures, spans: Sequence[Span], window: tuple[float, float], n: int) -> None:
    cols = columns_of(spans)
    kinds: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for s in cols.picked(cols.in_cats(MEMCPY_CATS) & _inside(cols, window)):
        entry = kinds[s.name.removeprefix("Memcpy ")]
        entry[0] += 1
        entry[1] += s.end - s.start
    figures.memcpy = sorted(
        (MemcpyKind(kind, int(c), us / n / _US_PER_MS) for kind, (c, us) in kinds.items()),
        key=lambda m: m.ms_per_step,
        reverse=True,
    )
    pageable = [m for m in figures.memcpy if m.kind.startswith("HtoD") and "Pageable" in m.kind]
    figures.pageable_htod_calls = sum(m.calls for m in pageable)
    figures.pageable_htod_ms_per_step = sum(m.ms_per_step for m in pageable)


def _memory(figures: TraceFigures, parsed: ParsedTrace, steps: Sequence[StepSpan]) -> None:
    """Allocated bytes at the end of each step (device 0 or the first device sampled): growth per step by
    least squares (two steps or more), and the peak (any number)."""
    samples = parsed.memory
    if not samples:
        return
    device = samples[0].device
    series = [m for m in samples if m.device == device]
    ends, i, last = [], 0, None
    for step in steps:
        while i < len(series) and series[i].ts <= step.end:
            last = series[i].allocated
            i += 1
        if last is not None:
            ends.append(last)
    figures.memory_absolute = parsed.memory_has_totals
    figures.memory_peak_gb = max(m.allocated for m in series) / BYTES_PER_GB
    if len(ends) >= 2:
        slope = statistics.linear_regression(range(len(ends)), ends).slope
        figures.memory_growth_mb_per_step = slope / BYTES_PER_MB
        figures.memory_growth_steps = sum(1 for a, b in zip(ends, ends[1:], strict=False) if b > a)
