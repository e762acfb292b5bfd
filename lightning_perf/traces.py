"""Reading, rewriting and analysing torch.profiler Chrome traces (``*.pt.trace.json[.gz]``).

Parsing is kept apart from the analyses that read parsed data (HolisticTraceAnalysis style):

- parsing: :class:`TraceReader` streams the events of ``traceEvents`` one by one (plain or gzip) and gives the
  top-level metadata, never holding the decompressed file or the whole event list; :func:`load_trace` keeps
  only the fields the analyses read, as compact :class:`Span` tuples;
- rewriting: :func:`rewrite_trace` makes torch-tb-profiler 0.4.3 count DataLoader time and adds the
  ``distributedInfo`` rank that HolisticTraceAnalysis requires;
- analyses over events (reader dicts or spans): :func:`step_spans`, :func:`step_breakdown` (the Overview
  breakdown of torch-tb-profiler), :func:`kernel_busy_pct` (its "GPU Utilization"), :func:`cpu_operator_stats`
  and :func:`kernel_stats`.

Standard library only; imports nothing from torch or Lightning. Times are in microseconds, as in the trace.
"""

from __future__ import annotations

import bisect
import gzip
import json
import math
import os
import re
import shutil
import sys
import tempfile
import zlib
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any, NamedTuple

GZIP_MAGIC = b"\x1f\x8b"
# Characters read at a time: the per-chunk cost vanishes, and the reader's memory stays a few MiB.
READ_CHUNK_CHARS = 1 << 20
# One JSON value (an event, a metadata field) longer than this is treated as corruption, not buffered:
# torch events are at most a few KiB (long kernel names, input shapes), so 64 Mi chars is far beyond.
MAX_VALUE_CHARS = 64 << 20
# A decode error this close to the end of the buffer may only mean that the value continues in the next chunk
# (a cut escape sequence like \uXXXX or literal like Infinity is shorter than this).
_INCOMPLETE_TAIL_CHARS = 16
_WHITESPACE = re.compile(r"[ \t\n\r]*")
# The rewrite runs between training steps, so speed beats size: on a real torch trace (2 cores), level 1
# rewrote at 88 MB/s, level 6 at 69 and level 9 (gzip's default, what torch writes) at 38, for files 1.5x,
# 1.12x and 1.0x the size of torch's.
REWRITE_GZIP_LEVEL = 1
# Parts written to the output in one call: amortises the per-write cost of the text/gzip layers.
_WRITE_BATCH = 2048

# Category names, lower-cased (torch-tb-profiler lower-cases `cat` before looking it up).
KERNEL_CATS = frozenset({"kernel"})
MEMCPY_CATS = frozenset({"memcpy", "gpu_memcpy"})
MEMSET_CATS = frozenset({"memset", "gpu_memset"})
# "runtime" is the only name torch-tb-profiler 0.4.3 knows; torch 2.x writes cuda_runtime / cuda_driver.
RUNTIME_CATS = frozenset({"runtime", "cuda_runtime", "cuda_driver"})
OPERATOR_CATS = frozenset({"cpu_op", "operator", "python"})
USER_ANNOTATION_CAT = "user_annotation"
PYTHON_FUNCTION_CAT = "python_function"
# The category DataLoader spans get in the rewrite: torch-tb-profiler maps it to an operator event
# (trace.py EventTypeMap), which reaches its DataLoader rule.
DATALOADER_CATEGORY = "cpu_op"
# torch-tb-profiler's event_parser.py: these names are collectives whatever their category.
COMMUNICATION_OP_NAMES = frozenset(
    f"{lib}:{op}"
    for lib in ("nccl", "gloo")
    for op in ("broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter")
)
PROFILER_STEP_PREFIX = "ProfilerStep#"
DISTRIBUTED_INFO_KEY = "distributedInfo"
# Two float timestamps closer than this are the same instant: ts ~5e12 us carries ~0.001 us of rounding.
TIME_TOLERANCE_US = 0.01


class TraceError(ValueError):
    """A trace file is truncated, corrupt or not a torch.profiler Chrome trace. The message names the file."""


# ---------------------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------------------


def _open_text(path: str) -> IO[str]:
    """Open plain or gzip JSON as text, deciding by content (a renamed file still reads)."""
    try:
        with open(path, "rb") as fh:
            magic = fh.read(2)
        if magic == GZIP_MAGIC:
            return gzip.open(path, "rt", encoding="utf-8", newline="")
        return open(path, encoding="utf-8", newline="")  # noqa: SIM115 - closed by TraceReader
    except OSError as err:
        raise TraceError(f"{path}: cannot open trace file: {err.strerror or err}") from err


class _Scanner:
    """Whole JSON values and single characters out of a text stream read in chunks."""

    def __init__(self, stream: IO[str], path: str) -> None:
        self._stream = stream
        self.path = path
        self._buf = ""
        self._pos = 0
        self._consumed = 0  # characters dropped from the front of the buffer, for error positions
        self._eof = False
        self._decode = json.JSONDecoder(strict=False).raw_decode  # like the plugin: control chars allowed

    def error(self, what: str, pos: int | None = None) -> TraceError:
        where = self._consumed + (self._pos if pos is None else pos)
        return TraceError(f"{self.path}: {what} (at character {where})")

    def _fill(self) -> bool:
        if self._eof:
            return False
        try:
            chunk = self._stream.read(READ_CHUNK_CHARS)
        except (gzip.BadGzipFile, EOFError, zlib.error) as err:
            raise TraceError(f"{self.path}: truncated or corrupt gzip data: {err}") from err
        except OSError as err:
            raise TraceError(f"{self.path}: cannot read the trace file: {err}") from err
        except UnicodeDecodeError as err:
            raise TraceError(f"{self.path}: not UTF-8 text: {err}") from err
        if not chunk:
            self._eof = True
            return False
        self._consumed += self._pos
        self._buf = self._buf[self._pos :] + chunk
        self._pos = 0
        return True

    def peek(self) -> str:
        """The next non-whitespace character, not consumed; '' at the end of the file."""
        while True:
            self._pos = _WHITESPACE.match(self._buf, self._pos).end()  # type: ignore[union-attr]
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._fill():
                return ""

    def advance(self) -> None:
        self._pos += 1

    def expect(self, char: str, context: str) -> None:
        found = self.peek()
        if found != char:
            raise self.unexpected(f"expected {char!r} {context}, found {found!r}")
        self._pos += 1

    def truncated(self) -> TraceError:
        return self.error("unexpected end of file: the trace is truncated")

    def unexpected(self, what: str) -> TraceError:
        """``what`` went wrong at the current character; "truncated" when it is the end of the file."""
        return self.truncated() if not self.peek() else self.error(what)

    def value(self) -> tuple[Any, str]:
        """The next JSON value and its exact source text."""
        if not self.peek():
            raise self.truncated()
        while True:
            start = self._pos
            try:
                obj, end = self._decode(self._buf, start)
            except json.JSONDecodeError as err:
                incomplete = err.pos >= len(self._buf) - _INCOMPLETE_TAIL_CHARS or err.msg.startswith(
                    "Unterminated string"
                )
                if not incomplete:
                    raise self.error(f"invalid JSON: {err.msg}", err.pos) from None
                if len(self._buf) - start > MAX_VALUE_CHARS:
                    raise self.error(f"a JSON value longer than {MAX_VALUE_CHARS} characters") from None
                if self._fill():
                    continue
                raise self.truncated() from None
            if end == len(self._buf) and self._fill():
                continue  # a number at the end of the buffer may go on in the next chunk
            self._pos = end
            return obj, self._buf[start:end]


_META, _EVENTS_START, _EVENT, _EVENTS_END = range(4)


def _items(scanner: _Scanner) -> Iterator[tuple]:
    """Tagged items of a trace file in file order: (_META, key, value, raw), (_EVENTS_START,),
    (_EVENT, event, raw) for every element of traceEvents, (_EVENTS_END,)."""
    first = scanner.peek()
    if not first:
        raise scanner.error("empty file, not a Chrome trace")
    if first != "{":
        raise scanner.error(f"not a Chrome trace: the top level is not a JSON object (starts with {first!r})")
    scanner.advance()
    seen_events = False
    if scanner.peek() == "}":
        scanner.advance()
    else:
        while True:
            if scanner.peek() != '"':
                raise scanner.unexpected("expected a quoted key")
            key, _ = scanner.value()
            scanner.expect(":", f"after the key {key!r}")
            if key == "traceEvents":
                if seen_events:
                    raise scanner.error("two traceEvents arrays")
                seen_events = True
                yield from _event_items(scanner)
            else:
                value, raw = scanner.value()
                yield _META, key, value, raw
            separator = scanner.peek()
            if separator not in ("}", ","):
                raise scanner.unexpected("expected ',' or '}' after a value")
            scanner.advance()
            if separator == "}":
                break
    if scanner.peek():
        raise scanner.error("unexpected data after the top-level JSON object")
    if not seen_events:
        raise TraceError(f"{scanner.path}: not a Chrome trace: the top-level object has no traceEvents")


def _event_items(scanner: _Scanner) -> Iterator[tuple]:
    if scanner.peek() != "[":
        raise scanner.unexpected("traceEvents is not a JSON array")
    scanner.advance()
    yield (_EVENTS_START,)
    if scanner.peek() == "]":
        scanner.advance()
    else:
        index = 0
        while True:
            event, raw = scanner.value()
            if not isinstance(event, dict):
                raise scanner.error(f"traceEvents[{index}] is not a JSON object")
            yield _EVENT, event, raw
            index += 1
            separator = scanner.peek()
            if separator not in ("]", ","):
                raise scanner.unexpected("expected ',' or ']' in traceEvents")
            scanner.advance()
            if separator == "]":
                break
    yield (_EVENTS_END,)


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
            self._items = _items(_Scanner(self._stream, self.path))
            for item in self._items:
                if item[0] == _EVENTS_START:
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
        """The events of traceEvents in file order, one at a time. Can be iterated once."""
        for event, _ in self._raw_events():
            yield event

    def _raw_events(self) -> Iterator[tuple[dict[str, Any], str]]:
        if self._events_read:
            raise RuntimeError(f"{self.path}: the events of a TraceReader can be iterated only once")
        self._events_read = True
        for item in self._items:
            if item[0] != _EVENT:
                break  # _EVENTS_END
            yield item[1], item[2]
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
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    if global_rank >= world_size:
        raise ValueError(f"global_rank must be < world_size, got {global_rank} and {world_size}")
    if backend is not None and (not isinstance(backend, str) or not backend):
        raise ValueError(f"backend must be a non-empty string or None, got {backend!r}")
    src, dst = os.fspath(src), os.fspath(dst)
    directory = os.path.dirname(dst) or "."
    # the temporary name must not end like a trace: TensorBoard may be scanning the folder
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(dst)}.", suffix=".partial", dir=directory)
    os.close(fd)
    try:
        with TraceReader(src) as reader, _open_output(tmp, gz=dst.endswith(".gz")) as out:
            _write_rewritten(reader, out, global_rank, world_size, backend)
        shutil.copymode(src, tmp)  # mkstemp makes it owner-only; TensorBoard may run as another user
        os.replace(tmp, dst)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
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
    if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
        raise ValueError(f"event {event.get('name')!r} has a non-numeric ts or dur: {ts!r}, {dur!r}")
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


@dataclass
class ParsedTrace:
    """What :func:`load_trace` keeps of one trace file."""

    path: str
    metadata: dict[str, Any]
    # complete events but python_function ones (no analysis reads them; they are most of a with_stack trace)
    spans: list[Span]
    event_count: int

    @property
    def rank(self) -> int | None:
        info = self.metadata.get(DISTRIBUTED_INFO_KEY)
        rank = info.get("rank") if isinstance(info, dict) else None
        return rank if isinstance(rank, int) else None


def load_trace(path: str | os.PathLike[str]) -> ParsedTrace:
    """Stream one trace file into a :class:`ParsedTrace`. :class:`TraceError` naming the file on bad input."""
    spans: list[Span] = []
    count = 0
    with TraceReader(path) as reader:
        for event in reader.events():
            count += 1
            if event.get("cat") == PYTHON_FUNCTION_CAT:
                continue
            try:
                span = span_of(event)
            except ValueError as err:
                raise TraceError(f"{reader.path}: traceEvents[{count - 1}]: {err}") from None
            if span is not None:
                spans.append(span)
        return ParsedTrace(reader.path, reader.metadata, spans, count)


def _as_spans(events: Iterable[Mapping[str, Any] | Span]) -> Iterator[Span]:
    for event in events:
        if isinstance(event, Span):
            yield event
        else:
            span = span_of(event)
            if span is not None:
                yield span


# ---------------------------------------------------------------------------------------------------------
# Interval arithmetic over sorted, disjoint (start, end) lists
# ---------------------------------------------------------------------------------------------------------

Ranges = list[tuple[float, float]]


def merge_ranges(ranges: Iterable[tuple[float, float]]) -> Ranges:
    """Sorted, disjoint union of intervals (touching ones joined)."""
    merged: Ranges = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def intersect_ranges(a: Ranges, b: Ranges) -> Ranges:
    out: Ranges = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract_ranges(a: Ranges, b: Ranges) -> Ranges:
    out: Ranges = []
    j = 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > start:
                out.append((start, b[k][0]))
            start = max(start, b[k][1])
            k += 1
        if start < end:
            out.append((start, end))
    return out


def ranges_length(ranges: Iterable[tuple[float, float]]) -> float:
    return math.fsum(end - start for start, end in ranges)


def _clipped_length(ranges: Ranges, starts: list[float], start: float, end: float) -> float:
    """Length of sorted disjoint ``ranges`` (whose starts are ``starts``) inside [start, end]."""
    i = max(bisect.bisect_right(starts, start) - 1, 0)
    total = 0.0
    while i < len(ranges) and ranges[i][0] < end:
        total += max(0.0, min(end, ranges[i][1]) - max(start, ranges[i][0]))
        i += 1
    return total


# ---------------------------------------------------------------------------------------------------------
# Analyses
# ---------------------------------------------------------------------------------------------------------


class StepSpan(NamedTuple):
    step: int
    start: float
    end: float


def _is_step(span: Span) -> bool:
    # host-side only: torch also mirrors ProfilerStep# onto GPU streams as gpu_user_annotation
    return span.name.startswith(PROFILER_STEP_PREFIX) and not span.cat.startswith("gpu_")


def _step_number(name: str) -> int | None:
    try:
        return int(name[len(PROFILER_STEP_PREFIX) :])
    except ValueError:
        return None


def step_spans(events: Iterable[Mapping[str, Any] | Span]) -> list[StepSpan]:
    """The host-side ProfilerStep#N spans, sorted by start."""
    steps = []
    for span in _as_spans(events):
        if _is_step(span):
            number = _step_number(span.name)
            if number is not None:
                steps.append(StepSpan(number, span.start, span.end))
    return sorted(steps, key=lambda s: s.start)


def kernel_busy_pct(
    events: Iterable[Mapping[str, Any] | Span], window: tuple[float, float] | None = None
) -> float | None:
    """Share (0-100) of ``window`` in which at least one GPU kernel (cat ``kernel``) ran: torch-tb-profiler's
    "GPU Utilization". Kernel intervals are merged (overlaps count once) and clipped to the window, which
    defaults to the first ProfilerStep# start .. the last ProfilerStep# end (the span of all complete events
    when there is no step). None when there are no kernel events."""
    kernels: Ranges = []
    step_lo = lo = math.inf
    step_hi = hi = -math.inf
    for span in _as_spans(events):
        if span.cat in KERNEL_CATS:
            kernels.append((span.start, span.end))
        elif _is_step(span):
            step_lo, step_hi = min(step_lo, span.start), max(step_hi, span.end)
        lo, hi = min(lo, span.start), max(hi, span.end)
    if not kernels:
        return None
    if window is None:
        window = (step_lo, step_hi) if step_lo < math.inf else (lo, hi)
    start, end = window
    if not end > start:
        raise ValueError(f"window must be (start, end) with end > start, got {window!r}")
    busy = ranges_length(intersect_ranges(merge_ranges(kernels), [(start, end)]))
    return 100.0 * busy / (end - start)


# The Overview categories, in the plugin's display order, and their labels.
CATEGORIES = ("dataloader", "cpu_exec", "kernel", "memcpy", "memset", "communication", "runtime", "other")
CATEGORY_LABELS = {
    "dataloader": "DataLoader",
    "cpu_exec": "CPU Exec",
    "kernel": "Kernel",
    "memcpy": "Memcpy",
    "memset": "Memset",
    "communication": "Communication",
    "runtime": "Runtime",
    "other": "Other",
}
# torch-tb-profiler's ProfileRole order: time covered by several categories goes to the first one here;
# step time covered by none of them is "other". So the categories partition each step.
_PRIORITY = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec")
# event_parser.py _update_steps_duration: the last step with GPU activity is dropped from the Overview when
# it matched fewer than 80% of the previous step's GPU activities (the profiler likely missed some).
_TAIL_STEP_KERNEL_RATIO = 0.8


@dataclass
class StepBreakdown:
    """One step's time per category (microseconds); the categories sum to the step's duration."""

    step: int | None  # None: no ProfilerStep# in the trace, the whole host span as one step (as the plugin)
    start: float
    end: float
    categories: dict[str, float]

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass
class Breakdown:
    steps: list[StepBreakdown] = field(default_factory=list)
    # steps were extended to the GPU work they launched, as torch-tb-profiler does
    device_aligned: bool = False
    # trailing steps dropped because their kernels look incompletely captured (the plugin's rule)
    dropped_tail_steps: int = 0

    def average(self) -> dict[str, float]:
        """Mean per category over the steps, plus ``total`` (the mean step duration). Empty without steps."""
        if not self.steps:
            return {}
        n = len(self.steps)
        avg = {c: math.fsum(s.categories[c] for s in self.steps) / n for c in CATEGORIES}
        avg["total"] = math.fsum(s.duration for s in self.steps) / n
        return avg


def step_breakdown(events: Iterable[Mapping[str, Any] | Span]) -> Breakdown:
    """Each ProfilerStep's time split into torch-tb-profiler's Overview categories (event_parser.py and
    overall_parser.py of torch-tb-profiler 0.4.3), with these deliberate differences for torch 2.x traces:

    - DataLoader spans count whatever their category (the plugin drops user_annotation ones: DataLoader = 0
      unless the trace went through :func:`rewrite_trace`); GPU-side mirrors (gpu_*) are ignored;
    - cuda_runtime / cuda_driver count as Runtime (the plugin only knows the old name "Runtime");
    - kernels whose name starts with "nccl" count as Communication even without a matching nccl:* op;
    - ProfilerStep# mirrors on GPU streams (gpu_user_annotation) are not steps.

    Other user_annotation spans (record_function ranges) are not CPU Exec, as in the plugin: only the
    operators inside them are.
    """
    roles: dict[str, Ranges] = {role: [] for role in _PRIORITY}
    kernels: list[Span] = []
    device: list[Span] = []
    runtimes: list[Span] = []
    comm_ids: set[Any] = set()
    steps: list[tuple[int | None, float, float]] = []
    cpu_lo, cpu_hi = math.inf, -math.inf
    for span in _as_spans(events):
        cat, interval = span.cat, (span.start, span.end)
        if cat in KERNEL_CATS:
            kernels.append(span)
            device.append(span)
        elif cat in MEMCPY_CATS:
            roles["memcpy"].append(interval)
            device.append(span)
        elif cat in MEMSET_CATS:
            roles["memset"].append(interval)
            device.append(span)
        elif cat in RUNTIME_CATS:
            roles["runtime"].append(interval)
            runtimes.append(span)
        elif is_dataloader_span(span.name) and not cat.startswith("gpu_"):
            roles["dataloader"].append(interval)
        elif _is_step(span):
            steps.append((_step_number(span.name), span.start, span.end))
        elif span.name in COMMUNICATION_OP_NAMES and (cat in OPERATOR_CATS or cat == USER_ANNOTATION_CAT):
            roles["communication"].append(interval)
            if span.external_id is not None:
                comm_ids.add(span.external_id)
        elif cat in OPERATOR_CATS:
            roles["cpu_exec"].append(interval)
        if cat in OPERATOR_CATS or _is_step(span):
            cpu_lo, cpu_hi = min(cpu_lo, span.start), max(cpu_hi, span.end)
    for k in kernels:
        comm = (k.external_id is not None and k.external_id in comm_ids) or k.name.lower().startswith("nccl")
        roles["communication" if comm else "kernel"].append((k.start, k.end))

    steps.sort(key=lambda s: s[1])
    if not steps and cpu_lo < cpu_hi:
        steps = [(None, cpu_lo, cpu_hi)]
    result = Breakdown()
    if not steps:
        return result
    steps, result.device_aligned, result.dropped_tail_steps = _align_steps_to_device(steps, runtimes, device)

    slots = merge_ranges((start, end) for _, start, end in steps)
    attributed: dict[str, Ranges] = {}
    for role in _PRIORITY:
        attributed[role] = intersect_ranges(slots, merge_ranges(roles[role]))
        slots = subtract_ranges(slots, attributed[role])
    attributed["other"] = slots
    starts = {role: [r[0] for r in ranges] for role, ranges in attributed.items()}
    for number, start, end in steps:
        costs = {c: _clipped_length(attributed[c], starts[c], start, end) for c in CATEGORIES}
        result.steps.append(StepBreakdown(number, start, end, costs))
    return result


def _align_steps_to_device(
    steps: list[tuple[int | None, float, float]], runtimes: list[Span], device: list[Span]
) -> tuple[list[tuple[int | None, float, float]], bool, int]:
    """torch-tb-profiler's _find_device_steps/_update_steps_duration: a step ends when the GPU work launched
    (by runtime calls inside its host span) ends, and starts no earlier than the previous step's end."""
    by_correlation: dict[Any, list[int]] = defaultdict(list)
    for index, d in enumerate(device):
        if d.correlation is not None:
            by_correlation[d.correlation].append(index)
    host_starts = [s[1] for s in steps]
    dev_lo = [math.inf] * len(steps)
    dev_hi = [-math.inf] * len(steps)
    matched_counts = [0] * len(steps)
    matched: set[int] = set()
    for rt in runtimes:
        i = bisect.bisect_right(host_starts, rt.start) - 1
        if i < 0 or rt.end > steps[i][2] or rt.correlation is None:
            continue  # launched outside any step, or straddling a step's end
        for index in by_correlation.get(rt.correlation, ()):
            dev_lo[i] = min(dev_lo[i], device[index].start)
            dev_hi[i] = max(dev_hi[i], device[index].end)
            matched_counts[i] += 1
            matched.add(index)
    if not matched:
        return steps, False, 0
    prev_end = steps[0][1]
    if dev_lo[0] < math.inf:  # GPU work left over from before the first step delays its start
        for index, d in enumerate(device):
            if index not in matched and d.end < dev_lo[0]:
                prev_end = max(prev_end, d.end)
    aligned = []
    for i, (number, host_start, host_end) in enumerate(steps):
        start = max(prev_end, host_start)
        end = max(host_end, dev_hi[i]) if matched_counts[i] else max(host_end, start)
        end = max(end, start)
        aligned.append((number, start, end))
        prev_end = end
    keep = len(aligned)
    last = max((i for i, count in enumerate(matched_counts) if count), default=-1)
    if len(aligned) > 1 and last >= 0:
        keep = last + 1
        if last > 0 and matched_counts[last - 1] * _TAIL_STEP_KERNEL_RATIO > matched_counts[last]:
            keep = last
    return aligned[:keep], True, len(aligned) - keep


@dataclass
class OperatorStat:
    name: str
    calls: int
    self_us: float
    total_us: float


def cpu_operator_stats(events: Iterable[Mapping[str, Any] | Span]) -> list[OperatorStat]:
    """Host operators (cpu_op and user_annotation spans, ProfilerStep# excluded) aggregated by name, sorted by
    self time: each span's duration minus its direct children's on the same thread (torch's self_cpu_time)."""
    by_thread: dict[tuple[Any, Any], list[Span]] = defaultdict(list)
    for span in _as_spans(events):
        if span.cat in OPERATOR_CATS or span.cat == USER_ANNOTATION_CAT:
            by_thread[(span.pid, span.tid)].append(span)
    stats: dict[str, OperatorStat] = {}

    def record(name: str, self_us: float, total_us: float) -> None:
        if name.startswith(PROFILER_STEP_PREFIX):
            return
        stat = stats.get(name)
        if stat is None:
            stat = stats[name] = OperatorStat(name, 0, 0.0, 0.0)
        stat.calls += 1
        stat.self_us += max(self_us, 0.0)
        stat.total_us += total_us

    for spans in by_thread.values():
        spans.sort(key=lambda s: (s.start, -s.end))
        stack: list[list[Any]] = []  # [end, self time, span]
        for span in spans:
            while stack and stack[-1][0] <= span.start + TIME_TOLERANCE_US:
                _, self_us, done = stack.pop()
                record(done.name, self_us, done.end - done.start)
            duration = span.end - span.start
            if stack and span.end <= stack[-1][0] + TIME_TOLERANCE_US:
                stack[-1][1] -= duration  # a direct child
            stack.append([span.end, duration, span])
        for _, self_us, done in stack:
            record(done.name, self_us, done.end - done.start)
    return sorted(stats.values(), key=lambda s: s.self_us, reverse=True)


def kernel_stats(events: Iterable[Mapping[str, Any] | Span]) -> list[OperatorStat]:
    """GPU kernels aggregated by name, sorted by total time (a kernel's self time is its duration)."""
    stats: dict[str, OperatorStat] = {}
    for span in _as_spans(events):
        if span.cat in KERNEL_CATS:
            stat = stats.get(span.name)
            if stat is None:
                stat = stats[span.name] = OperatorStat(span.name, 0, 0.0, 0.0)
            stat.calls += 1
            stat.self_us += span.end - span.start
            stat.total_us += span.end - span.start
    return sorted(stats.values(), key=lambda s: s.total_us, reverse=True)
