"""Loading one trace file into a :class:`~lightning_perf.traces.read.spans.ParsedTrace`.

:func:`load_trace` streams the file through :class:`~lightning_perf.traces.read.reader.TraceReader`, a batch of
events at a time decoded into the typed :class:`~lightning_perf.traces.read.event_types.Event`, and keeps the
complete events as :class:`~lightning_perf.traces.read.spans.Span` tuples, the allocator's memory samples and the
top-level metadata. A batch the typed decoding cannot hold exactly goes through :mod:`json`'s dicts instead.
The spans' numpy columns (:class:`~lightning_perf.traces.read.columns.SpanColumns`) are built batch by batch by a
:class:`~lightning_perf.traces.read.columns.ColumnsBuilder` from the same decoded lists and kept on the span
list, so the analyses do not take the tuples apart again.

Standard library, msgspec and numpy; imports nothing from torch or Lightning.
"""

from __future__ import annotations

import json
import operator
import os
import sys
from collections.abc import Mapping
from itertools import compress, repeat
from typing import Any

import numpy as np
from msgspec import UNSET

from lightning_perf.traces.read.columns import ColumnsBuilder
from lightning_perf.traces.read.event_types import Event, decode_events
from lightning_perf.traces.read.reader import TraceReader
from lightning_perf.traces.read.spans import (
    CUDA_DEVICE_TYPE,
    MEMORY_EVENT_NAME,
    PYTHON_FUNCTION_CAT,
    MemorySample,
    ParsedTrace,
    Span,
    SpanList,
    gc_paused,
    span_of,
)
from lightning_perf.traces.vendors import is_tensor_core_eligible

# load_trace's shortcut: events whose ts and dur are JSON numbers within this bound are finite, and so are their
# sums (span_of checks every other event)
_PLAIN_NUMBERS = (int, float)
_PLAIN_LIMIT = 1e300
_new_tuple = tuple.__new__  # a Span without the Python-level __new__ of NamedTuple (same tuple)
_INPUT_TYPE = operator.attrgetter("input_type")
intern = sys.intern


class _Loaded:
    """What load_trace keeps so far, filled batch by batch."""

    def __init__(self) -> None:
        self.spans: list[Span] = SpanList()
        self.columns = ColumnsBuilder()
        self.memory: list[MemorySample] = []
        self.running: dict[int, float] = {}  # device -> running sum of allocator changes (torch 1.9)
        self.has_totals = False
        self.count = self.skipped = 0
        self.reason: str | None = None
        self.lowered: dict[str, str] = {}  # category -> interned lower case: a dozen over ~1e5 events
        self.eligible: dict[str, bool] = {}  # name -> is_tensor_core_eligible: a few hundred over ~1e5 events


@gc_paused()
def load_trace(path: str | os.PathLike[str]) -> ParsedTrace:
    """Stream one trace file into a :class:`ParsedTrace`. :class:`TraceError` naming the file on bad JSON;
    events with impossible times are skipped and counted (``skipped_events``), never turned into inf/nan.

    The events are decoded a batch at a time into the typed :class:`~lightning_perf.traces.read.event_types.Event`
    (the fields read, nothing else); a batch it cannot hold exactly (a value of another type, a complete event
    without finite times) is decoded into dicts and read as before, so the result is the same either way."""
    loaded = _Loaded()
    with TraceReader(path) as reader:
        for batch, text in reader.typed_batches(decode_events):
            if text is None:
                _add_dicts(batch, loaded)
            elif not _add_typed(batch, loaded):
                _add_dicts(_DICT_DECODE(text), loaded)
        loaded.spans.columns = loaded.columns.columns(loaded.spans)  # what columns_of gives for this list
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


def _add_typed(batch: list[Event], loaded: _Loaded) -> bool:
    """Add the typed events of one batch; False, with nothing added, when one of them needs the dict reader
    (a complete event without ts, or with times out of range: its skip reason quotes the event as written).

    The dict reader's work (below) done a field at a time over the batch: comprehensions and C-level maps,
    no Python statement per event."""
    memory_events = [e for e in batch if e.name == MEMORY_EVENT_NAME and e.cat != PYTHON_FUNCTION_CAT]
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
    raw_cats = [e.cat for e in complete]
    for cat in set(raw_cats).difference(lowered):
        lowered[cat] = intern(cat.lower())
    args = [e.args for e in complete]
    ends = starts + durations
    fields = (
        list(map(intern, [e.name for e in complete])),
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
    input_types = _eligible_input_types(names, args, loaded)
    loaded.spans.extend(
        map(
            _new_tuple,
            repeat(Span),
            zip(
                names,
                cats,
                starts.tolist(),
                ends.tolist(),
                pids,
                tids,
                external_ids,
                correlations,
                strict=True,
            ),
        )
    )
    sequences = [-1 if a is None else a.sequence for a in args]
    loaded.columns.add(starts, ends, *fields, input_types=input_types, sequences=sequences)
    loaded.count += len(batch)
    return True


def _eligible_input_types(names: list[str], args: list[Any], loaded: _Loaded) -> tuple[list[int], list[Any]]:
    """(indices, raw ``Input type`` texts as bytes, None for none) of the batch's tensor-core-eligible operators:
    their types decide whether their matmuls ran on matrix cores, no analysis reads any other's. C-level passes
    (``compress``, ``map``) but for the rare operator without args."""
    eligible = loaded.eligible
    for name in set(names).difference(eligible):
        eligible[name] = is_tensor_core_eligible(name)
    chosen = list(compress(range(len(names)), map(eligible.__getitem__, names)))
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
    first = len(loaded.spans)
    added_args = _add_dict_spans(batch, loaded)
    spans = loaded.spans[first:]
    loaded.columns.add_spans(spans, _dict_input_types(spans, added_args), _dict_sequences(added_args))


def _dict_sequences(batch_args: list[Any]) -> list[int]:
    """Each span's ``Sequence number`` where it is an int64, else -1 (the typed reader's reading)."""
    return [
        number
        if type(args) is dict
        and type(number := args.get("Sequence number")) is int
        and -(2**63) <= number < 2**63
        else -1
        for args in batch_args
    ]


def _dict_input_types(spans: list[Span], batch_args: list[Any]) -> tuple[list[int], list[Any]]:
    """(indices, ``Input type`` values) of the tensor-core-eligible operators among ``spans`` (added from event
    dicts, ``batch_args`` their args) that have a list of strings there."""
    picked = [
        (i, types)
        for i, (span, args) in enumerate(zip(spans, batch_args, strict=True))
        if is_tensor_core_eligible(span.name)
        and type(args) is dict
        and type(types := args.get("Input type")) is list
        and all(type(t) is str for t in types)
    ]
    return [i for i, _ in picked], [tuple(types) for _, types in picked]


def _add_dict_spans(batch: list[dict[str, Any]], loaded: _Loaded) -> list[Any]:
    """Add the spans of the event dicts of one batch; returns the args of the spans added, in order."""
    spans, memory, running, lowered = loaded.spans, loaded.memory, loaded.running, loaded.lowered
    add_span = spans.append
    added_args: list[Any] = []
    add_args = added_args.append
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
            add_args(args)
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
            add_args(event.get("args"))
    return added_args


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
