"""Parsed trace data: the fields the analyses read, kept as compact tuples.

:func:`~lightning_perf.traces.read.loader.load_trace` keeps the complete events of a trace as :class:`Span`
tuples (:func:`span_of`), the allocator's memory samples and the device properties, in a :class:`ParsedTrace`. :func:`step_spans` finds the host-side ProfilerStep#N spans.

Standard library only; imports nothing from torch or Lightning. Times are in microseconds, as in
the trace.
"""

from __future__ import annotations

import contextlib
import gc
import math
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from lightning_perf.analysis.numbers import finite
from lightning_perf.traces.read.reader import DISTRIBUTED_INFO_KEY
from lightning_perf.traces.vendors import DEVICE_KERNEL_CATS
from lightning_perf.traces.vendors import RUNTIME_CATS as RUNTIME_CATS  # re-exported: read from here too

# Category names, lower-cased (torch-tb-profiler lower-cases `cat` before looking it up). The kernel and
# runtime categories of every vendor (CUDA, ROCm, MTIA, XPU) are in traces/vendors.py.
KERNEL_CATS = DEVICE_KERNEL_CATS
MEMCPY_CATS = frozenset({"memcpy", "gpu_memcpy"})
MEMSET_CATS = frozenset({"memset", "gpu_memset"})
OPERATOR_CATS = frozenset({"cpu_op", "operator", "python"})
PYTHON_FUNCTION_CAT = "python_function"
# torch-tb-profiler's event_parser.py: these names are collectives whatever their category.
COMMUNICATION_OP_NAMES = frozenset(
    f"{lib}:{op}"
    for lib in ("nccl", "gloo")
    for op in ("broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter")
)
PROFILER_STEP_PREFIX = "ProfilerStep#"
# Allocator samples: instant events named "[memory]" (profile_memory=True). "Total Allocated" since torch 1.10;
# torch 1.9 wrote only the change ("Bytes"). Device Type is c10's DeviceType: 0 CPU, 1 CUDA (ROCm reports 1 too).
MEMORY_EVENT_NAME = "[memory]"
CUDA_DEVICE_TYPE = 1
# Two float timestamps closer than this are the same instant: ts ~5e12 us carries ~0.001 us of rounding.
TIME_TOLERANCE_US = 0.01

# ---------------------------------------------------------------------------------------------------------
# Parsed data: the fields the analyses read
# ---------------------------------------------------------------------------------------------------------


class Span(NamedTuple):
    """One complete ('X') event with the fields the analyses read. Times in microseconds."""

    name: str
    cat: str  # lower-cased
    start: float
    end: float
    pid: Any
    tid: Any
    external_id: int | None
    correlation: int | None


def span_of(event: Mapping[str, Any]) -> Span | None:
    """The span of a complete event; None for any other phase. ValueError when its ts/dur are not numbers."""
    if event.get("ph") != "X":
        return None
    ts = event.get("ts")
    dur = event.get("dur", 0)
    try:
        start, length = finite(ts), finite(dur)
    except OverflowError:  # an integer too large for a float
        start = length = None
    if start is None or length is None or length < 0 or not math.isfinite(start + length):
        raise ValueError(
            f"event {event.get('name')!r} has no finite ts or no finite dur >= 0: ts={ts!r}, dur={dur!r}"
        )
    args = event.get("args")
    external_id = correlation = None
    if isinstance(args, dict):
        external_id = args.get("External id", args.get("external id"))
        correlation = args.get("correlation")
    return Span(
        sys.intern(str(event.get("name", ""))),  # a few hundred distinct names over ~1e5 events
        sys.intern(str(event.get("cat", "")).lower()),
        start,
        start + length,
        event.get("pid"),
        event.get("tid"),
        external_id,
        correlation,
    )


class MemorySample(NamedTuple):
    """One allocator event on a GPU: bytes allocated after it (a running sum of changes when the trace has no
    totals: then relative to the first sample)."""

    ts: float
    device: int
    allocated: float


@dataclass
class ParsedTrace:
    """What :func:`load_trace` keeps of one trace file."""

    path: str
    metadata: dict[str, Any]
    # the complete events but python_function ones (no analysis reads them; they are most of a with_stack
    # trace), as a SpanColumns (traces/read/columns.py; typed Any: that module imports this one): what the
    # analyses read, and a sequence of the spans itself
    columns: Any = field(compare=False)
    event_count: int
    # GPU allocator samples in file order (empty unless the trace was recorded with profile_memory)
    memory: list[MemorySample] = field(default_factory=list)
    # the samples are totals ("Total Allocated"), not a running sum of changes from the first one
    memory_has_totals: bool = False
    # complete events left out because their ts/dur are missing, negative or not finite, and the first reason
    skipped_events: int = 0
    skip_reason: str | None = None

    @property
    def spans(self) -> list[Span]:
        """The spans as :class:`Span` tuples (a :class:`SpanList` holding the columns), made from the columns the
        first time they are asked for and kept: the analyses read the columns, and only a caller that wants the
        tuples pays for them."""
        spans = self.__dict__.get("_spans")
        if spans is None:
            spans = self.__dict__["_spans"] = self.columns.spans
        return spans

    @property
    def device_properties(self) -> list[dict[str, Any]]:
        """torch's ``deviceProperties`` (name, totalGlobalMem, computeMajor, ...), one per visible GPU."""
        props = self.metadata.get("deviceProperties")
        return [p for p in props if isinstance(p, dict)] if isinstance(props, list) else []

    @property
    def rank(self) -> int | None:
        info = self.metadata.get(DISTRIBUTED_INFO_KEY)
        rank = info.get("rank") if isinstance(info, dict) else None
        return rank if isinstance(rank, int) else None


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection inside (reference counting still frees everything): reading a trace makes
    ~1e5 containers that live on, and the collector's passes over them cost a fifth of the time. The events
    and spans hold no cycles. Nested uses and a collector disabled by the caller are left as they were."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class SpanList(list["Span"]):
    """The spans :func:`load_trace` made (Span tuples only): :func:`as_spans` takes it without a check."""

    # its SpanColumns, made once by columns_of (typed Any: columns.py imports this module)
    columns: Any = None


def as_spans(events: Iterable[Mapping[str, Any] | Span]) -> list[Span]:
    """The spans of ``events`` (Span tuples or event dicts) as a list: ``events`` itself when it is a list of
    Span already (what :func:`load_trace` gives), so the analyses loop over it without a step per span."""
    if type(events) is SpanList or (isinstance(events, list) and set(map(type, events)) <= {Span}):
        return events
    spans = []
    for event in events:
        if isinstance(event, Span):
            spans.append(event)
        else:
            span = span_of(event)
            if span is not None:
                spans.append(span)
    return spans


# ---------------------------------------------------------------------------------------------------------
# Analyses
# ---------------------------------------------------------------------------------------------------------


class StepSpan(NamedTuple):
    step: int
    start: float
    end: float


def is_step(span: Span) -> bool:
    # host-side only: torch also mirrors ProfilerStep# onto GPU streams as gpu_user_annotation
    return span.name.startswith(PROFILER_STEP_PREFIX) and not span.cat.startswith("gpu_")


def step_number(name: str) -> int | None:
    try:
        return int(name[len(PROFILER_STEP_PREFIX) :])
    except ValueError:
        return None


def step_spans(events: Iterable[Mapping[str, Any] | Span]) -> list[StepSpan]:
    """The host-side ProfilerStep#N spans, sorted by start."""
    steps = []
    for span in as_spans(events):
        if span.name.startswith(PROFILER_STEP_PREFIX) and is_step(span):
            number = step_number(span.name)
            if number is not None:
                steps.append(StepSpan(number, span.start, span.end))
    return sorted(steps, key=lambda s: s.start)
