"""Parsed trace data: the fields the analyses read, kept as compact tuples.

:func:`load_trace` streams one file through :class:`~lightning_perf.traces.reader.TraceReader` and keeps only
the complete events as :class:`Span` tuples (:func:`span_of`), the allocator's memory samples and the device
properties, in a :class:`ParsedTrace`. :func:`step_spans` finds the host-side ProfilerStep#N spans.

Standard library and msgspec only; imports nothing from torch or Lightning. Times are in microseconds, as in
the trace.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, NamedTuple

import numpy as np
from msgspec import UNSET

from lightning_perf.analysis.numbers import finite
from lightning_perf.traces.event_types import Event, decode_events
from lightning_perf.traces.reader import DISTRIBUTED_INFO_KEY, TraceReader

# Category names, lower-cased (torch-tb-profiler lower-cases `cat` before looking it up).
KERNEL_CATS = frozenset({"kernel"})
MEMCPY_CATS = frozenset({"memcpy", "gpu_memcpy"})
MEMSET_CATS = frozenset({"memset", "gpu_memset"})
# "runtime" is the only name torch-tb-profiler 0.4.3 knows; torch 2.x writes cuda_runtime / cuda_driver.
RUNTIME_CATS = frozenset({"runtime", "cuda_runtime", "cuda_driver", "hip_runtime"})
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
        bad = finite(ts) is None or finite(dur) is None or dur < 0 or not math.isfinite(ts + dur)
    except OverflowError:  # an integer too large for a float
        bad = True
    if bad:
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
        float(ts),
        float(ts) + float(dur),
        event.get("pid"),
        event.get("tid"),
        external_id,
        correlation,
    )


# load_trace's shortcut: events whose ts and dur are JSON numbers within this bound are finite, and so are their
# sums (span_of checks every other event)
_PLAIN_NUMBERS = (int, float)
_PLAIN_LIMIT = 1e300
_new_tuple = tuple.__new__  # a Span without the Python-level __new__ of NamedTuple (same tuple)
intern = sys.intern


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
    # complete events but python_function ones (no analysis reads them; they are most of a with_stack trace)
    spans: list[Span]
    event_count: int
    # GPU allocator samples in file order (empty unless the trace was recorded with profile_memory)
    memory: list[MemorySample] = field(default_factory=list)
    # the samples are totals ("Total Allocated"), not a running sum of changes from the first one
    memory_has_totals: bool = False
    # complete events left out because their ts/dur are missing, negative or not finite, and the first reason
    skipped_events: int = 0
    skip_reason: str | None = None

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


class SpanList(list):  # type: ignore[type-arg]
    """The spans :func:`load_trace` made (Span tuples only): :func:`as_spans` takes it without a check."""


class _Loaded:
    """What load_trace keeps so far, filled batch by batch."""

    def __init__(self) -> None:
        self.spans: list[Span] = SpanList()
        self.memory: list[MemorySample] = []
        self.running: dict[int, float] = {}  # device -> running sum of allocator changes (torch 1.9)
        self.has_totals = False
        self.count = self.skipped = 0
        self.reason: str | None = None
        self.lowered: dict[str, str] = {}  # category -> interned lower case: a dozen over ~1e5 events


@gc_paused()
def load_trace(path: str | os.PathLike[str]) -> ParsedTrace:
    """Stream one trace file into a :class:`ParsedTrace`. :class:`TraceError` naming the file on bad JSON;
    events with impossible times are skipped and counted (``skipped_events``), never turned into inf/nan.

    The events are decoded a batch at a time into the typed :class:`~lightning_perf.traces.event_types.Event`
    (the fields read, nothing else); a batch it cannot hold exactly (a value of another type, a complete event
    without finite times) is decoded into dicts and read as before, so the result is the same either way."""
    loaded = _Loaded()
    with TraceReader(path) as reader:
        for batch, text in reader.typed_batches(decode_events):
            if text is None:
                _add_dicts(batch, loaded)
            elif not _add_typed(batch, text, loaded):
                _add_dicts(_DICT_DECODE(text), loaded)
        return ParsedTrace(
            reader.path,
            reader.metadata,
            loaded.spans,
            loaded.count,
            loaded.memory,
            loaded.has_totals,
            loaded.skipped,
            loaded.reason,
        )


_DICT_DECODE = json.JSONDecoder(strict=False).decode  # as the scanner's: control characters allowed


def _add_typed(batch: list[Event], text: str, loaded: _Loaded) -> bool:
    """Add the typed events of one batch; False, with nothing added, when one of them needs the dict reader
    (a complete event without ts, or with times out of range: its skip reason quotes the event as written).

    The dict reader's work (below) done a field at a time over the batch: comprehensions and C-level maps,
    no Python statement per event."""
    # the batch's JSON text says whether any event may be an allocator sample (a name written with escapes
    # could hide it: then the events are looked at)
    maybe_memory = MEMORY_EVENT_NAME in text or "\\" in text
    memory_events = maybe_memory and [
        e for e in batch if e.name == MEMORY_EVENT_NAME and e.cat != PYTHON_FUNCTION_CAT
    ]
    complete = [
        e for e in batch if e.ph == "X" and e.cat != PYTHON_FUNCTION_CAT and e.name != MEMORY_EVENT_NAME
    ]
    try:
        starts = np.array([e.ts for e in complete], dtype=np.float64)
        durations = np.array([e.dur for e in complete], dtype=np.float64)
    except (TypeError, OverflowError):  # a ts left UNSET, an integer beyond a float
        return False
    if not (np.all(np.abs(starts) < _PLAIN_LIMIT) and np.all((durations >= 0) & (durations < _PLAIN_LIMIT))):
        return False
    if memory_events:
        loaded.has_totals = _add_typed_memory(memory_events, loaded) or loaded.has_totals
    lowered = loaded.lowered
    cats = [e.cat for e in complete]
    for cat in set(cats).difference(lowered):
        lowered[cat] = intern(cat.lower())
    args = [e.args for e in complete]
    loaded.spans.extend(
        map(
            _new_tuple,
            repeat(Span),
            zip(
                map(intern, [e.name for e in complete]),
                map(lowered.__getitem__, cats),
                starts.tolist(),
                (starts + durations).tolist(),
                [e.pid for e in complete],
                [e.tid for e in complete],
                [
                    None
                    if a is None
                    else a.external_id
                    if a.external_id is not UNSET
                    else (None if a.external_id_lower is UNSET else a.external_id_lower)
                    for a in args
                ],  # args.get("External id", args.get("external id")), inline: a call per span costs 15%
                [None if a is None else a.correlation for a in args],
                strict=True,
            ),
        )
    )
    loaded.count += len(batch)
    return True


def _add_typed_memory(events: list[Event], loaded: _Loaded) -> bool:
    has_totals = False
    for event in events:
        args = event.args
        if args is None or event.ts is UNSET:
            continue
        has_totals = (
            _add_memory_sample(
                event.ts,
                args.device_type,
                0 if args.device_id is UNSET else args.device_id,
                None if args.total_allocated is UNSET else args.total_allocated,
                None if args.bytes is UNSET else args.bytes,
                loaded.memory,
                loaded.running,
            )
            or has_totals
        )
    return has_totals


def _add_dicts(batch: list[dict[str, Any]], loaded: _Loaded) -> None:
    """Add the event dicts of one batch (any event the JSON holds)."""
    spans, memory, running, lowered = loaded.spans, loaded.memory, loaded.running, loaded.lowered
    add_span = spans.append
    for event in batch:
        loaded.count += 1
        # span_of's work written out for the common event (numbers in range, string name and category)
        get = event.get
        cat = get("cat")
        if cat == PYTHON_FUNCTION_CAT:
            continue
        name = get("name")
        if name == MEMORY_EVENT_NAME:
            loaded.has_totals = _add_memory_event(event, memory, running) or loaded.has_totals
            continue
        if get("ph") != "X":
            continue
        ts, dur = get("ts"), get("dur", 0)
        if (
            type(name) is str
            and type(cat) is str
            and type(ts) in _PLAIN_NUMBERS
            and type(dur) in _PLAIN_NUMBERS
            and -_PLAIN_LIMIT < ts < _PLAIN_LIMIT
            and 0 <= dur < _PLAIN_LIMIT
        ):
            args = get("args")
            external_id = correlation = None
            if type(args) is dict:
                external_id = args.get("External id", args.get("external id"))
                correlation = args.get("correlation")
            low = lowered.get(cat)
            if low is None:
                low = lowered[cat] = sys.intern(cat.lower())
            start = float(ts)
            add_span(
                _new_tuple(
                    Span,
                    (
                        intern(name),
                        low,
                        start,
                        start + float(dur),
                        get("pid"),
                        get("tid"),
                        external_id,
                        correlation,
                    ),
                )
            )
            continue
        try:
            span = span_of(event)
        except ValueError as err:
            loaded.skipped += 1
            loaded.reason = loaded.reason or f"traceEvents[{loaded.count - 1}]: {err}"
            continue
        if span is not None:
            add_span(span)


def _add_memory_event(
    event: Mapping[str, Any], memory: list[MemorySample], running: dict[int, float]
) -> bool:
    """Add the sample of one allocator event dict; True when it is a total."""
    args = event.get("args")
    if not isinstance(args, dict):
        return False
    sample = (
        args.get("Device Type"),
        args.get("Device Id", 0),
        args.get("Total Allocated"),
        args.get("Bytes"),
    )
    return _add_memory_sample(event.get("ts"), *sample, memory, running)


def _add_memory_sample(
    ts: Any,
    device_type: Any,
    device: Any,
    total: Any,
    change: Any,
    memory: list[MemorySample],
    running: dict[int, float],
) -> bool:
    """Add one allocator event's sample (the fields of its args as written); True when it is a total."""
    if not isinstance(ts, (int, float)) or device_type != CUDA_DEVICE_TYPE:
        return False
    device = device if isinstance(device, int) else 0
    if not isinstance(total, (int, float)):
        if not isinstance(change, (int, float)):
            return False
        running[device] = running.get(device, 0.0) + change
        memory.append(MemorySample(float(ts), device, running[device]))
        return False
    memory.append(MemorySample(float(ts), device, float(total)))
    return True


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
