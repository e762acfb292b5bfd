"""The fields of a trace event the analyses read, as msgspec Structs: typed decoding of ``traceEvents``.

Decoding a batch of events straight into these Structs skips building a Python dict for every field no analysis
reads (most of a Kineto event: shapes, stream, device, flow ids...); on shared/realtraces it decodes several
times faster than :mod:`json`. The types are strict on purpose: a value of another type (a string pid, a bool
ts, a null dur, an args that is not an object), NaN or a control character in a string fails the batch, which
:class:`~lightning_perf.traces.read.json_scanner.JsonScanner` then decodes with :mod:`json` into dicts as before,
so every file read before is read the same (the loader of :mod:`~lightning_perf.traces.read.spans` treats the rare
events these Structs cannot tell apart, like a complete event without ts, the same way).

Imports msgspec only.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

Number = int | float


class EventArgs(msgspec.Struct, gc=False):
    """The ``args`` fields the analyses read: the ids that link operators, runtime calls and GPU work, the
    allocator's sample (``[memory]`` events; kept as decoded, any type, checked by the loader), and an operator's
    input types (``record_shapes=True``: what decides whether its matmul ran on matrix cores)."""

    external_id: int | None | UnsetType = msgspec.field(default=UNSET, name="External id")
    external_id_lower: int | None | UnsetType = msgspec.field(default=UNSET, name="external id")
    correlation: int | None = None
    # the autograd sequence number: a forward operator and the backward ones of the node it created share it
    sequence: int = msgspec.field(default=-1, name="Sequence number")
    device_type: Any = msgspec.field(default=UNSET, name="Device Type")
    device_id: Any = msgspec.field(default=UNSET, name="Device Id")
    total_allocated: Any = msgspec.field(default=UNSET, name="Total Allocated")
    bytes: Any = msgspec.field(default=UNSET, name="Bytes")
    # the JSON text as written (any value: checked when read), not parsed: only tensor-core-eligible operators'
    # are kept, coded by their text, and the few hundred distinct texts parsed at the end
    input_type: msgspec.Raw = msgspec.field(default=None, name="Input type")


class Event(msgspec.Struct, gc=False):
    """One element of ``traceEvents``: a missing field gets the value ``event.get(field)`` gave the dict
    reader (``None``, or ``""``/``0`` where that reader turned ``None`` into those), ``ts`` stays UNSET."""

    ph: str | None = None
    name: str = ""
    cat: str = ""
    ts: Number | UnsetType = UNSET
    dur: Number = 0
    pid: int | str | None = None
    tid: int | str | None = None
    args: EventArgs | None = None


# one decoder for every batch (a Decoder is built once and reused: building it is the slow part)
EVENTS_DECODER = msgspec.json.Decoder(list[Event])


def decode_events(text: str) -> list[Event]:
    """The events of a JSON array of objects; ValueError (msgspec.DecodeError, ValidationError) otherwise."""
    return EVENTS_DECODER.decode(text)
