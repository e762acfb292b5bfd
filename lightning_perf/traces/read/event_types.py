"""The fields of a trace event the analyses read, as msgspec Structs: typed decoding of ``traceEvents``.

Decoding a batch of events straight into these Structs skips building a Python dict for every field no analysis
reads (most of a Kineto event: shapes, stream, device, flow ids...); on shared/realtraces it decodes several
times faster than :mod:`json`. The types are strict on purpose: an event with a value of another type (a string
pid, a bool ts, a null dur, an args that is not an object, a sequence number beyond int64), NaN or a control
character in a string is decoded alone into :mod:`json`'s dict by
:class:`~lightning_perf.traces.read.json_scanner.JsonScanner`, and the loader
(:func:`~lightning_perf.traces.read.loader.event_of`) makes it the Event of what the dict holds, so every event
is read as a dict reads it.

Imports msgspec only.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import UNSET, UnsetType

Number = int | float
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class EventArgs(msgspec.Struct, gc=False):
    """The ``args`` fields the analyses read: the ids that link operators, runtime calls and GPU work, the
    allocator's sample (``[memory]`` events; kept as decoded, any type, checked by the loader), and an operator's
    input types (``record_shapes=True``: what decides whether its matmul ran on matrix cores)."""

    external_id: int | None | UnsetType = msgspec.field(default=UNSET, name="External id")
    external_id_lower: int | None | UnsetType = msgspec.field(default=UNSET, name="external id")
    correlation: int | None = None
    # the autograd sequence number: a forward operator and the backward ones of the node it created share it
    # (an int64 column: a larger one does not fit the Struct, and the loader reads it as none)
    sequence: Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)] = msgspec.field(
        default=-1, name="Sequence number"
    )
    device_type: Any = msgspec.field(default=UNSET, name="Device Type")
    device_id: Any = msgspec.field(default=UNSET, name="Device Id")
    total_allocated: Any = msgspec.field(default=UNSET, name="Total Allocated")
    bytes: Any = msgspec.field(default=UNSET, name="Bytes")
    # the JSON text as written (any value: checked when read), not parsed: only tensor-core-eligible operators'
    # are kept, coded by their text, and the few hundred distinct texts parsed at the end
    # None where absent: msgspec takes no ``Raw | None`` (a null would decode as None, any other value fail)
    input_type: msgspec.Raw = msgspec.field(default=None, name="Input type")  # type: ignore[assignment]


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
