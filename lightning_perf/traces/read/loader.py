"""Loading one trace file into a :class:`~lightning_perf.traces.read.spans.ParsedTrace`.

:func:`load_trace` streams the file through :class:`~lightning_perf.traces.read.reader.TraceReader`, a batch of
events at a time decoded into the typed :class:`~lightning_perf.traces.read.event_types.Event`, and keeps the
complete events, the allocator's memory samples and the top-level metadata. A batch the typed decoding cannot hold exactly goes through :mod:`json`'s dicts instead.
The spans are kept as numpy columns (:class:`~lightning_perf.traces.read.columns.SpanColumns`), built batch by
batch by a :class:`~lightning_perf.traces.read.columns.ColumnsBuilder` from the decoded lists: no tuple a span
(``ParsedTrace.spans`` makes the tuples from the columns when a caller asks for them).

Standard library, msgspec and numpy; imports nothing from torch or Lightning.
"""

from __future__ import annotations

import json
import math
import operator
import os
import sys
from itertools import accumulate, compress, repeat
from typing import Any

import msgspec
import numpy as np
from msgspec import UNSET

from lightning_perf.analysis.numbers import finite
from lightning_perf.traces.read.columns import ColumnsBuilder
from lightning_perf.traces.read.event_types import INT64_MAX, INT64_MIN, Event, EventArgs
from lightning_perf.traces.read.reader import TraceReader
from lightning_perf.traces.read.spans import (
    CUDA_DEVICE_TYPE,
    MEMORY_EVENT_NAME,
    PYTHON_FUNCTION_CAT,
    MemorySample,
    ParsedTrace,
    gc_paused,
    span_of,
)
from lightning_perf.traces.vendors import is_tensor_core_eligible

# load_trace's shortcut: events whose ts and dur are numbers within this bound are finite, and so are their sums
# (the events of a batch with any other are checked one by one)
_PLAIN_LIMIT = 1e300
_NUMBER_TYPES, _INT_TYPE = {int, float}, {int}  # exact types: a bool is neither here
_new_tuple = tuple.__new__  # a Span without the Python-level __new__ of NamedTuple (same tuple)
_INPUT_TYPE = operator.attrgetter("input_type")
intern = sys.intern


class _Loaded:
    """What load_trace keeps so far, filled batch by batch."""

    def __init__(self) -> None:
        self.columns = ColumnsBuilder()
        self.memory: list[MemorySample] = []
        self.running: dict[int, float] = {}  # device -> running sum of allocator changes (torch 1.9)
        self.has_totals = False
        self.count = self.skipped = 0
        self.reason: str | None = None
        self.lowered: dict[str, str] = {}  # category -> interned lower case: a dozen over ~1e5 events
        # is_tensor_core_eligible by name code (a few hundred names over ~1e5 events)
        self.eligible = np.zeros(0, dtype=bool)


@gc_paused()
def load_trace(path: str | os.PathLike[str]) -> ParsedTrace:
    """Stream one trace file into a :class:`ParsedTrace`. :class:`TraceError` naming the file on bad JSON;
    events with impossible times are skipped and counted (``skipped_events``), never turned into inf/nan.

    The events are decoded a batch at a time into the typed :class:`~lightning_perf.traces.read.event_types.Event`
    (the fields read, nothing else); an event the Struct cannot hold comes as a dict, made an Event by
    :func:`event_of`, so every event goes through the same code."""
    loaded = _Loaded()
    with TraceReader(path) as reader:
        for batch, exact in reader.decoded_batches(Event):
            problems: dict[int, str] = {}
            if not exact:
                batch = [
                    event if type(event) is Event else event_of(event, problems, i)
                    for i, event in enumerate(batch)
                ]
            _add_events(batch, loaded, problems)
        return ParsedTrace(
            reader.path,
            reader.metadata,
            loaded.columns.columns(None),
            loaded.count,
            loaded.memory,
            loaded.has_totals,
            loaded.skipped,
            loaded.reason,
        )


def _add_events(batch: list[Event], loaded: _Loaded, problems: dict[int, str]) -> None:
    """Add the events of one batch: its allocator samples, its complete events as columns, and the
    complete events without finite times as skipped (``problems``: by place in the batch, those :func:`event_of`
    found, with the reason that quotes them as written).

    A field at a time over the batch: comprehensions and C-level maps, no Python statement per event."""
    first = loaded.count
    loaded.count += len(batch)
    memory_events = [e for e in batch if e.name == MEMORY_EVENT_NAME and e.cat != PYTHON_FUNCTION_CAT]
    if memory_events:
        loaded.has_totals = _add_typed_memory(memory_events, loaded) or loaded.has_totals
    complete = [
        e for e in batch if e.ph == "X" and e.cat != PYTHON_FUNCTION_CAT and e.name != MEMORY_EVENT_NAME
    ]
    try:
        starts = np.array([e.ts for e in complete], dtype=np.float64)
        durations = np.array([e.dur for e in complete], dtype=np.float64)
        plain = bool(
            np.all(np.abs(starts) < _PLAIN_LIMIT) and np.all((durations >= 0) & (durations < _PLAIN_LIMIT))
        )
    except (TypeError, OverflowError):  # a ts left UNSET, an integer beyond a float
        plain = False
    if problems or not plain:  # rare: the events one by one
        complete = _with_finite_times(batch, first, problems, loaded)
        starts = np.array([e.ts for e in complete], dtype=np.float64)
        durations = np.array([e.dur for e in complete], dtype=np.float64)
    lowered = loaded.lowered
    raw_cats = [e.cat for e in complete]
    for cat in set(raw_cats).difference(lowered):
        lowered[cat] = intern(cat.lower())
    args = [e.args for e in complete]
    ends = starts + durations
    fields = (
        [e.name for e in complete],  # coded by the columns, whose names list holds one string a name
        list(map(lowered.__getitem__, raw_cats)),
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
    )
    names, cats, pids, tids, external_ids, correlations = fields
    name_codes = loaded.columns.name_codes(names)
    input_types = _eligible_input_types(name_codes, args, loaded)
    sequences = [-1 if a is None else a.sequence for a in args]
    loaded.columns.add(
        starts, ends, *fields, input_types=input_types, sequences=sequences, name_codes=name_codes
    )


def _with_finite_times(
    batch: list[Event], first: int, problems: dict[int, str], loaded: _Loaded
) -> list[Event]:
    """The complete events of ``batch`` (its first at ``first`` in traceEvents) whose times make a span (what
    :func:`~lightning_perf.traces.read.spans.span_of` takes: finite numbers, dur >= 0, a finite end); each other
    one is counted as skipped, the first reason kept."""
    kept = []
    for i, event in enumerate(batch):
        if event.ph != "X" or event.cat == PYTHON_FUNCTION_CAT or event.name == MEMORY_EVENT_NAME:
            continue
        reason = problems.get(i)
        if reason is None:
            ts, dur = None if event.ts is UNSET else event.ts, event.dur
            try:
                start, length = finite(ts), finite(dur)
            except OverflowError:  # an integer too large for a float
                start = length = None
            if start is not None and length is not None and length >= 0 and math.isfinite(start + length):
                kept.append(event)
                continue
            reason = f"event {event.name!r} has no finite ts or no finite dur >= 0: ts={ts!r}, dur={dur!r}"
        loaded.skipped += 1
        loaded.reason = loaded.reason or f"traceEvents[{first + i}]: {reason}"
    return kept


def event_of(event: dict[str, Any], problems: dict[int, str], place: int) -> Event:
    """A decoded event dict as the :class:`Event` of its fields as the dict reads (``event.get``; a name or
    category of another type as its text, as :func:`~lightning_perf.traces.read.spans.span_of` makes them). A
    complete event whose times make no span gets span_of's reason in ``problems[place]``."""
    args = event.get("args")
    made = Event(
        ph=event.get("ph"),
        name=str(event.get("name", "")),
        cat=str(event.get("cat", "")),
        ts=event.get("ts", UNSET),
        dur=event.get("dur", 0),
        pid=event.get("pid"),
        tid=event.get("tid"),
        args=_args_of(args) if type(args) is dict else None,
    )
    if made.ph == "X" and made.cat != PYTHON_FUNCTION_CAT and made.name != MEMORY_EVENT_NAME:
        try:
            span_of(event)
        except ValueError as err:
            problems[place] = str(err)
    return made


def _args_of(args: dict[str, Any]) -> EventArgs:
    """The :class:`EventArgs` of an event's args dict, read as the typed decoding reads them."""
    sequence = args.get("Sequence number")
    types = args.get("Input type")
    return EventArgs(
        external_id=args.get("External id", args.get("external id")),
        correlation=args.get("correlation"),
        sequence=sequence if type(sequence) is int and INT64_MIN <= sequence <= INT64_MAX else -1,
        device_type=args.get("Device Type", UNSET),
        device_id=args.get("Device Id", UNSET),
        total_allocated=args.get("Total Allocated", UNSET),
        bytes=args.get("Bytes", UNSET),
        # a list of strings, as its JSON text (what the typed decoding keeps); anything else is no types
        input_type=msgspec.Raw(json.dumps(types).encode())
        if type(types) is list and all(type(t) is str for t in types)
        else None,
    )


def _eligible_input_types(
    name_codes: np.ndarray, args: list[Any], loaded: _Loaded
) -> tuple[list[int], list[Any]]:
    """(indices, raw ``Input type`` texts as bytes, None for none) of the batch's tensor-core-eligible operators
    (``name_codes``: the codes of the batch's names): their types decide whether their matmuls ran on matrix
    cores, no analysis reads any other's. Eligibility is decided once a name, spread over the batch by its
    codes; C-level passes but for the rare operator without args."""
    known = len(loaded.eligible)
    new = loaded.columns.names(known)
    if new:
        decided = np.fromiter(map(is_tensor_core_eligible, new), bool, len(new))
        loaded.eligible = np.concatenate((loaded.eligible, decided))
    chosen: list[int] = np.flatnonzero(loaded.eligible[name_codes]).tolist()
    if not chosen:
        return chosen, []
    try:
        raws = list(map(_INPUT_TYPE, map(args.__getitem__, chosen)))
    except AttributeError:  # an operator without args
        raws = [None if args[i] is None else args[i].input_type for i in chosen]
    try:
        return chosen, list(map(bytes, raws))
    except TypeError:  # an operator without input types
        return chosen, [None if raw is None else bytes(raw) for raw in raws]


def _add_typed_memory(events: list[Event], loaded: _Loaded) -> bool:
    """Add the samples of a batch's allocator events; True when one is a total. The common batches in C-level
    passes (a profile_memory trace has ~1e4 such events): the host's events dropped, then every CUDA event a
    total (torch 1.10+), or every one a change on one device (torch 1.9), times and devices plain numbers; any
    other batch event by event."""
    args = [e.args for e in events]
    if None not in args:
        cuda = [a.device_type == CUDA_DEVICE_TYPE for a in args]
        events, args = list(compress(events, cuda)), list(compress(args, cuda))  # the others add nothing
        times = [e.ts for e in events]
        devices = [0 if a.device_id is UNSET else a.device_id for a in args]
        totals = [a.total_allocated for a in args]
        if set(map(type, times)) <= _NUMBER_TYPES and set(map(type, devices)) <= _INT_TYPE:
            if set(map(type, totals)) <= _NUMBER_TYPES:
                samples = zip(map(float, times), devices, map(float, totals), strict=True)
                loaded.memory.extend(map(_new_tuple, repeat(MemorySample), samples))
                return bool(events)
            changes = [a.bytes for a in args]
            one_device = len(set(devices)) == 1
            if one_device and totals.count(UNSET) == len(totals) and set(map(type, changes)) <= _NUMBER_TYPES:
                device = devices[0]
                sums = list(accumulate(changes, operator.add, initial=loaded.running.get(device, 0.0)))
                loaded.running[device] = sums[-1]
                samples = zip(map(float, times), devices, sums[1:], strict=True)
                loaded.memory.extend(map(_new_tuple, repeat(MemorySample), samples))
                return False
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
