"""What the host does around the GPU: which operator issued each runtime call, and which calls block the host.

A runtime call (``cudaLaunchKernel``, ``cudaMemcpyAsync``, ...) is issued by the operators whose spans hold it
on the same thread (nesting); the GPU work it starts carries the same correlation id. So
:func:`issuing_operators` gives, for every runtime call, the innermost and the outermost operator around it,
and :func:`blocking_calls` the calls that hold the host until the GPU catches up.

Standard library and numpy. Times are in microseconds, as in the trace.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from lightning_perf.traces.read.columns import SpanColumns, columns_of
from lightning_perf.traces.read.spans import (
    MEMCPY_CATS,
    OPERATOR_CATS,
    PROFILER_STEP_PREFIX,
    RUNTIME_CATS,
    TIME_TOLERANCE_US,
    Span,
    StepSpan,
)
from lightning_perf.traces.vendors import is_async_copy_call, is_sync_call

# Which runtime calls launch, wait or copy (CUDA and HIP) is traces/vendors.py's tables.

# An asynchronous copy call that lasts this long waited for the GPU: issuing one costs a few microseconds
# (NVIDIA's CUDA C++ Best Practices Guide, "Asynchronous and overlapping transfers"; torch-tb-profiler's
# traces show 5-20 us for a cudaMemcpyAsync that returns at once). Our choice: 50 us, well above that.
BLOCKING_COPY_MIN_US = 50.0
# Copies that involve pageable host memory are synchronous for the host (CUDA Runtime API, "API
# synchronization behavior"): the memcpy's name says which memory it used.
PAGEABLE_MARKER = "Pageable"
DEVICE_TO_DEVICE = "DtoD"


class Issuer(NamedTuple):
    """The operators around one runtime call: innermost and outermost (None when outside any operator)."""

    inner: str | None
    outer: str | None

    def label(self) -> str:
        if self.outer is None:
            return "(no operator)"
        return self.outer if self.inner in (None, self.outer) else f"{self.outer} > {self.inner}"


# Span.start and Span.end by index: C-level sort keys (no Python call, no key tuple per span)
def issuing_operators(spans: Iterable[Span], inner_index: dict[int, int] | None = None) -> dict[int, Issuer]:
    """Each runtime call's :class:`Issuer`, by the call's index in the span list (of :func:`columns_of`), by
    nesting on the calling thread (ProfilerStep# and other user annotations are not operators). ``inner_index``,
    when given, gets each call's innermost operator as a span index (for its input types)."""
    cols = columns_of(spans)
    calls = cols.in_cats(RUNTIME_CATS)
    operators = cols.in_cats(OPERATOR_CATS) & ~cols.where_name(
        lambda name: name.startswith(PROFILER_STEP_PREFIX)
    )
    # threads without runtime calls (DataLoader or autograd threads without launches) are left out
    operators &= np.isin(cols.thread_code, cols.thread_code[calls])
    # by start, then the longer span first, then operators before the runtime calls they hold
    order, threads = cols.nesting_order(operators | calls, before=calls.astype(np.int8))
    found: dict[int, Issuer] = {}
    issuers: dict[tuple[str | None, str | None], Issuer] = {}  # one Issuer per (inner, outer) pair
    stack: list[str] = []  # the names of the operators open at this point of the walk
    stack_ends: list[float] = []
    stack_index: list[int] = []  # their span indices, kept only for inner_index
    keep_index = inner_index is not None
    pair: tuple[str | None, str | None]  # the (inner, outer) operators of a call
    thread = None
    walk = zip(
        order.tolist(),
        threads.tolist(),
        cols.start[order].tolist(),
        cols.end[order].tolist(),
        calls[order].tolist(),
        [cols.names[code] for code in cols.name_code[order].tolist()],
        strict=True,
    )
    for index, span_thread, start, end, is_call, name in walk:
        if span_thread != thread:
            stack.clear()
            stack_ends.clear()
            stack_index.clear()
            thread = span_thread
        limit = start + TIME_TOLERANCE_US
        while stack_ends and stack_ends[-1] <= limit:
            stack_ends.pop()
            stack.pop()
            if keep_index:
                stack_index.pop()
        if not is_call:
            stack.append(name)
            stack_ends.append(end)
            if keep_index:
                stack_index.append(index)
            continue
        if (
            stack_ends
            and stack_ends[-1] + TIME_TOLERANCE_US >= end
            and stack_ends[0] + TIME_TOLERANCE_US >= end
        ):
            pair = (stack[-1], stack[0])  # the common case, inline: the top and the bottom both last
            if inner_index is not None:
                inner_index[index] = stack_index[-1]
        else:
            depths = _innermost_and_outermost(stack_ends, end)
            pair = (None, None) if depths is None else (stack[depths[0]], stack[depths[1]])
            if inner_index is not None and depths is not None:
                inner_index[index] = stack_index[depths[0]]
        issuer = issuers.get(pair)
        if issuer is None:
            issuer = issuers[pair] = Issuer(*pair)
        found[index] = issuer
    return found


def _innermost_and_outermost(ends: list[float], end: float) -> tuple[int, int] | None:
    """The depths of the innermost and the outermost operator of the stack that last until ``end``: one scan
    from each side (both stop at once in the common case of properly nested spans); None when none lasts."""
    for depth in range(len(ends) - 1, -1, -1):
        if ends[depth] + TIME_TOLERANCE_US >= end:
            for outer in range(depth + 1):
                if ends[outer] + TIME_TOLERANCE_US >= end:
                    return depth, outer
    return None


def copy_names_by_correlation(spans: Iterable[Span]) -> dict[Any, str]:
    cols = columns_of(spans)
    return {s.correlation: s.name for s in cols.picked(cols.in_cats(MEMCPY_CATS) & cols.has_correlation)}


def is_blocking(call: Span, copy_name: str | None) -> bool:
    """A sync call; a synchronous copy; an asynchronous copy from or to pageable memory, or between host and
    device (or of unknown kind) that waited long."""
    if is_sync_call(call.name):
        return True
    if not is_async_copy_call(call.name):
        return False
    if copy_name is not None and PAGEABLE_MARKER in copy_name:
        return True
    if copy_name is not None and DEVICE_TO_DEVICE in copy_name:
        return False  # never waits for the copy: a long call is a full launch queue (the GPU is behind)
    return call.end - call.start >= BLOCKING_COPY_MIN_US


def blocking_mask(cols: SpanColumns) -> np.ndarray:
    """Mask of the runtime calls that block (:func:`is_blocking`): decided by name, and for the asynchronous
    copies (a few) one by one with the copy they started."""
    runtime = cols.in_cats(RUNTIME_CATS)
    blocking = runtime & cols.where_name(is_sync_call)
    copies = np.flatnonzero(runtime & cols.where_name(is_async_copy_call))
    if len(copies):
        names = copy_names_by_correlation(cols)
        blocking[copies] = [is_blocking(call, names.get(call.correlation)) for call in cols.picked(copies)]
    return blocking


class BlockingTotal(NamedTuple):
    name: str
    operator: str
    calls: int
    total_us: float


def step_index(times: np.ndarray, steps: Sequence[StepSpan]) -> np.ndarray:
    """For each time, the index of the host step (sorted by start) whose span holds it; -1 outside every step."""
    starts = np.array([s.start for s in steps], dtype=np.float64)
    ends = np.array([s.end for s in steps], dtype=np.float64)
    index = np.searchsorted(starts, times, side="right") - 1
    inside = index >= 0
    inside[inside] = times[inside] <= ends[index[inside]]
    return np.where(inside, index, -1)


def in_host_steps(cols: SpanColumns, steps: Sequence[StepSpan]) -> np.ndarray:
    """Mask of the spans that start inside one of the host ProfilerStep spans (sorted by start). The
    profiler's own calls (the cudaDeviceSynchronize when it stops) lie outside them."""
    return step_index(cols.start, steps) >= 0


def blocking_calls(
    spans: Sequence[Span],
    steps: Sequence[StepSpan],
    issuers: dict[int, Issuer] | None = None,
    blocking: np.ndarray | None = None,
) -> list[BlockingTotal]:
    """Blocking runtime calls made inside the host ``steps``, totalled by (call, issuing operator), longest
    first. Without steps, every call counts. ``issuers`` and ``blocking`` (:func:`blocking_mask`): what the
    caller has already."""
    issuers = issuing_operators(spans) if issuers is None else issuers
    cols = columns_of(spans)
    chosen = blocking_mask(cols) if blocking is None else blocking.copy()
    if steps:
        chosen &= in_host_steps(cols, steps)
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    no_operator = Issuer(None, None)
    chosen_indices = np.flatnonzero(chosen)
    for index, span in zip(chosen_indices.tolist(), cols.picked(chosen_indices), strict=True):
        total = totals[(span.name, issuers.get(index, no_operator).label())]
        total[0] += 1
        total[1] += span.end - span.start
    result = [BlockingTotal(name, op, int(n), us) for (name, op), (n, us) in totals.items()]
    return sorted(result, key=lambda b: b.total_us, reverse=True)
