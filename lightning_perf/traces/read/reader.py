"""Reading and rewriting torch.profiler Chrome traces (``*.pt.trace.json[.gz]``).

The parsing half of the trace code; the analyses that read parsed data live in
:mod:`lightning_perf.traces.figures.analysis` (HolisticTraceAnalysis style: parsing kept apart from analyses):

- parsing: :class:`TraceReader` streams the events of ``traceEvents`` (plain or gzip), a read chunk's worth
  decoded at a time by msgspec (:mod:`~lightning_perf.traces.read.json_scanner`), and gives the top-level
  metadata, never holding the decompressed file or the whole event list (:func:`iter_events`,
  :func:`read_metadata`);
- rewriting: :func:`rewrite_trace` makes torch-tb-profiler 0.4.3 count DataLoader time and adds the
  ``distributedInfo`` rank that HolisticTraceAnalysis requires; :func:`is_dataloader_span` is the plugin's
  DataLoader rule it relies on.

Standard library and msgspec (gzip read through :mod:`~lightning_perf.traces.read.gunzip`: ISA-L where installed);
imports nothing from torch or Lightning. Times are in microseconds, as in the trace.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator, Mapping
from typing import IO, Any

from lightning_perf.analysis.numbers import whole
from lightning_perf.atomic_file import atomic_path
from lightning_perf.errors import ConfigError
from lightning_perf.traces.read.gunzip import open_gzip_text
from lightning_perf.traces.read.json_scanner import (
    EVENT,
    EVENTS_START,
    JsonScanner,
    TraceError,
    trace_items,
)

GZIP_MAGIC = b"\x1f\x8b"
# Characters read at a time: the per-chunk cost vanishes, and the reader's memory stays a few MiB.
READ_CHUNK_CHARS = 1 << 20
# The rewrite runs between training steps, so speed beats size: on a real torch trace (2 cores), level 1
# rewrote at 88 MB/s, level 6 at 69 and level 9 (gzip's default, what torch writes) at 38, for files 1.5x,
# 1.12x and 1.0x the size of torch's.
REWRITE_GZIP_LEVEL = 1
# Parts written to the output in one call: amortises the per-write cost of the text/gzip layers.
_WRITE_BATCH = 2048

# Category names, lower-cased (torch-tb-profiler lower-cases `cat` before looking it up).
USER_ANNOTATION_CAT = "user_annotation"
# The category DataLoader spans get in the rewrite: torch-tb-profiler maps it to an operator event
# (trace.py EventTypeMap), which reaches its DataLoader rule.
DATALOADER_CATEGORY = "cpu_op"
DISTRIBUTED_INFO_KEY = "distributedInfo"


# ---------------------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------------------


def _open_text(path: str) -> IO[str]:
    """Open plain or gzip JSON as text, deciding by content (a renamed file still reads)."""
    try:
        with open(path, "rb") as fh:
            magic = fh.read(2)
        if magic == GZIP_MAGIC:
            return open_gzip_text(path)
        return open(path, encoding="utf-8", newline="")  # noqa: SIM115 - closed by TraceReader
    except OSError as err:
        raise TraceError(f"{path}: cannot open trace file: {err.strerror or err}") from err


class TraceReader:
    """Streaming reader of one trace file, plain or gzip::

        with TraceReader(path) as trace:
            trace.metadata          # the top-level fields before traceEvents (torch: all but traceName)
            for event in trace.events():
                ...
            trace.metadata              # now complete: fields written after traceEvents too

    Memory stays a few MiB whatever the file size. :class:`TraceError` (naming the file) for a missing,
    truncated, corrupt or foreign file; a truncated file may only be noticed at the end of :meth:`events`.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.metadata: dict[str, Any] = {}
        # (key, exact source text) in file order, and how many came before traceEvents: for the rewrite
        self._raw_metadata: list[tuple[str, str]] = []
        self._head_count = 0
        self._events_read = False
        self._stream = _open_text(self.path)
        try:
            self._scanner = JsonScanner(self._stream, self.path, READ_CHUNK_CHARS)
            self._items = trace_items(self._scanner)
            for item in self._items:
                if item[0] == EVENTS_START:
                    break
                self._add_metadata(item)
            self._head_count = len(self._raw_metadata)
        except BaseException:
            self.close()
            raise

    def _add_metadata(self, item: tuple) -> None:
        _, key, value, raw = item
        self.metadata[key] = value
        self._raw_metadata.append((key, raw))

    def events(self) -> Iterator[dict[str, Any]]:
        """The events of traceEvents in file order, one at a time. Can be iterated once (this or
        :meth:`event_batches`)."""
        for batch in self.event_batches():
            yield from batch

    def event_batches(self) -> Iterator[list[dict[str, Any]]]:
        """The events of traceEvents in file order, in lists of up to a read chunk's worth: the fastest way
        through a trace (no generator step per event)."""
        for events, _ in self.decoded_batches(dict[str, Any]):
            yield events

    def decoded_batches(self, event_type: Any) -> Iterator[tuple[list[Any], bool]]:
        """The events of traceEvents in file order, in lists of up to a read chunk's worth, each decoded by
        msgspec into ``event_type`` (a Struct, or ``dict[str, Any]``) or, where that type cannot hold it (a value
        of another type, NaN, a control character in a string), :mod:`json`'s dict of it; with whether the
        whole list is of ``event_type`` (no dicts to tell apart). Can be iterated once (this or
        :meth:`event_batches` or :meth:`events`)."""
        self._start_events()
        self._scanner.decode_events_as(event_type)
        for item in self._items:
            if item[0] != EVENT:
                break  # EVENTS_END
            yield item[1], item[2] is None and self._scanner.batch_exact
        self._read_tail()

    def _raw_events(self) -> Iterator[tuple[dict[str, Any], str]]:
        """The events one by one with their exact source text (for the rewrite)."""
        self._start_events()
        for item in self._items:
            if item[0] != EVENT:
                break  # EVENTS_END
            yield item[1][0], item[2][0]
        self._read_tail()

    def _start_events(self) -> None:
        if self._events_read:
            raise RuntimeError(f"{self.path}: the events of a TraceReader can be iterated only once")
        self._events_read = True

    def _read_tail(self) -> None:
        for item in self._items:  # the fields after traceEvents; also checks the file's end
            self._add_metadata(item)

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> TraceReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_events(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The events of one trace file, streamed (see :class:`TraceReader`)."""
    with TraceReader(path) as reader:
        yield from reader.events()


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """All top-level fields but traceEvents. Streams through the whole file (fields may follow the events)."""
    with TraceReader(path) as reader:
        for _ in reader.events():
            pass
        return reader.metadata


# ---------------------------------------------------------------------------------------------------------
# Rewrite for torch-tb-profiler and HolisticTraceAnalysis
# ---------------------------------------------------------------------------------------------------------


def is_dataloader_span(name: str) -> bool:
    """torch-tb-profiler's DataLoader rule (event_parser.py): enumerate(DataLoader)#...__next__ spans."""
    return (name.startswith("enumerate(DataLoader)#") and name.endswith(".__next__")) or name.startswith(
        "enumerate(DataPipe)#"
    )


def _needs_new_category(event: Mapping[str, Any]) -> bool:
    # torch 2.x records DataLoader spans as user_annotation, which the plugin drops (trace.py
    # create_trace_event keeps only ProfilerStep# and collectives of that category)
    name = event.get("name")
    cat = event.get("cat")
    return (
        event.get("ph") == "X"
        and isinstance(cat, str)
        and cat.lower() == USER_ANNOTATION_CAT
        and isinstance(name, str)
        and is_dataloader_span(name)
    )


def rewrite_trace(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    global_rank: int,
    world_size: int,
    backend: str | None = None,
) -> int:
    """Stream ``src`` to ``dst`` (gzip when ``dst`` ends with .gz) for torch-tb-profiler and HTA.

    DataLoader spans recorded as ``user_annotation`` get category ``cpu_op`` (name, times, ids, args and
    nesting unchanged), so the plugin's Overview counts DataLoader time; every other event is copied as its
    exact source text. The top level gets ``distributedInfo`` (written last) with ``rank`` and ``world_size``
    from the arguments, keeping torch's other fields (backend, pg_config under DDP); ``backend`` is added when
    given and torch recorded none. ``dst`` may equal ``src``: the output is written to a temporary file and
    renamed, so a reader never sees a half-written trace. Returns the number of bytes of ``dst``.
    """
    for name, value, least in (("global_rank", global_rank, 0), ("world_size", world_size, 1)):
        if whole(value) is None or value < least:
            raise ConfigError(f"{name} must be an int >= {least}, got {value!r}")
    if global_rank >= world_size:
        raise ConfigError(f"global_rank must be < world_size, got {global_rank} and {world_size}")
    if backend is not None and (not isinstance(backend, str) or not backend):
        raise ConfigError(f"backend must be a non-empty string or None, got {backend!r}")
    src, dst = os.fspath(src), os.fspath(dst)
    # the temporary name does not end like a trace: TensorBoard may be scanning the folder (open() gives the
    # file the umask's mode, as torch's own export does, so TensorBoard running as another user reads it)
    with (
        atomic_path(dst) as tmp,
        TraceReader(src) as reader,
        _open_output(tmp, gz=dst.endswith(".gz")) as out,
    ):
        _write_rewritten(reader, out, global_rank, world_size, backend)
    return os.path.getsize(dst)


def _open_output(path: str, gz: bool) -> IO[str]:
    if gz:
        return gzip.open(path, "wt", encoding="utf-8", newline="", compresslevel=REWRITE_GZIP_LEVEL)
    return open(path, "w", encoding="utf-8", newline="")  # noqa: SIM115 - closed by the caller


def _write_rewritten(
    reader: TraceReader, out: IO[str], global_rank: int, world_size: int, backend: str | None
) -> None:
    def write_fields(fields: list[tuple[str, str]]) -> None:
        for key, raw in fields:
            if key != DISTRIBUTED_INFO_KEY:  # written last, merged with ours
                out.write(f"  {json.dumps(key)}: {raw},\n")

    out.write("{\n")
    write_fields(reader._raw_metadata)
    out.write('  "traceEvents": [\n')
    parts: list[str] = []
    separator = ""
    for event, raw in reader._raw_events():
        if _needs_new_category(event):
            raw = json.dumps({**event, "cat": DATALOADER_CATEGORY}, ensure_ascii=False)
        parts.append(separator + raw)
        separator = ",\n"
        if len(parts) >= _WRITE_BATCH:
            out.write("".join(parts))
            parts.clear()
    out.write("".join(parts))
    out.write("\n  ],\n")
    write_fields(reader._raw_metadata[reader._head_count :])
    existing = reader.metadata.get(DISTRIBUTED_INFO_KEY)
    info = dict(existing) if isinstance(existing, dict) else {}
    info["rank"] = global_rank
    info["world_size"] = world_size
    if backend is not None:
        info.setdefault("backend", backend)
    out.write(f"  {json.dumps(DISTRIBUTED_INFO_KEY)}: {json.dumps(info)}\n}}\n")
