"""Whole JSON values, and batches of trace events, out of a text stream read in chunks: the tokenizer under
:class:`~lightning_perf.traces.read.reader.TraceReader`.

:class:`JsonScanner` keeps one read chunk (and the value it cuts) in memory; :func:`trace_items` walks the top
level of a Chrome trace with it. Standard library only (and the gzip errors of
:mod:`~lightning_perf.traces.read.gunzip`); a typed decoder (msgspec's, see
:mod:`lightning_perf.traces.read.event_types`) can be plugged in for the batches of events.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import IO, Any

from lightning_perf.errors import LightningPerfError
from lightning_perf.traces.read.gunzip import GZIP_ERRORS

# One JSON value (an event, a metadata field) longer than this is treated as corruption, not buffered:
# torch events are at most a few KiB (long kernel names, input shapes), so 64 Mi chars is far beyond.
MAX_VALUE_CHARS = 64 << 20
# A decode error this close to the end of the buffer may only mean that the value continues in the next chunk
# (a cut escape sequence like \uXXXX or literal like Infinity is shorter than this).
_INCOMPLETE_TAIL_CHARS = 16
_WHITESPACE = re.compile(r"[ \t\n\r]*")
# The end of one event of traceEvents, its comma and the start of the next. The events up to the last one in the
# buffer are decoded with one call of the C decoder (about twice as fast as one call per event). A match inside a
# string or a nested value leaves brackets or a string open, so that text fails to decode and is read one value
# at a time instead: a batch that decodes is exactly the events the file holds.
_EVENT_BOUNDARY = re.compile(r"\}[ \t\n\r]*,[ \t\n\r]*\{")
# Where to look for that boundary: the buffer's tail (events are at most a few KiB; a longer one is read alone).
_BOUNDARY_SEARCH_CHARS = 1 << 16
# Cuts tried before reading one value at a time until the next chunk: a cut that fails costs a decode of the batch.
_BATCH_TRIES = 3


class TraceError(LightningPerfError, ValueError):
    """A trace file is truncated, corrupt or not a torch.profiler Chrome trace. The message names the file."""


class JsonScanner:
    """Whole JSON values and single characters out of a text stream read in chunks."""

    def __init__(self, stream: IO[str], path: str, chunk_chars: int) -> None:
        self._stream = stream
        self._chunk_chars = chunk_chars
        self.path = path
        self._buf = ""
        self._pos = 0
        self._consumed = 0  # characters dropped from the front of the buffer, for error positions
        self._eof = False
        decoder = json.JSONDecoder(strict=False)  # like the plugin: control chars allowed
        self._decode = decoder.raw_decode
        self._decode_whole = decoder.decode
        # read events in batches (the rewrite reads them one by one, for their exact source text)
        self.batching = False
        # no cut of this buffer decoded: one value at a time until the next fill
        self._batch_failed = False
        # when set (with batching): tried first on a batch's JSON array text; a batch it decodes comes with
        # that text in ``batch_text`` (None for a batch of dicts): its events are typed objects, not dicts.
        # Any ValueError (wrong type, NaN, control characters...) falls back to json's decoding of the batch.
        self.typed_decode: Callable[[str], list[Any]] | None = None
        self.batch_text: str | None = None

    def error(self, what: str, pos: int | None = None) -> TraceError:
        where = self._consumed + (self._pos if pos is None else pos)
        return TraceError(f"{self.path}: {what} (at character {where})")

    def _fill(self) -> bool:
        if self._eof:
            return False
        try:
            chunk = self._stream.read(self._chunk_chars)
        except GZIP_ERRORS as err:
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
        self._batch_failed = False
        return True

    def _drop_to(self, pos: int) -> None:
        """Move to ``pos``, dropping the text before it: the rest of the chunk is a part of one event, whose
        decode fails until the next fill, and json's error then counts the lines of the whole buffer."""
        self._consumed += pos
        self._buf = self._buf[pos:]
        self._pos = 0

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
            except RecursionError:
                raise self.error("invalid JSON: nested too deeply", start) from None
            except ValueError as err:  # an integer of thousands of digits (int_max_str_digits)
                raise self.error(f"invalid JSON: {err}", start) from None
            if end == len(self._buf) and self._fill():
                continue  # a number at the end of the buffer may go on in the next chunk
            self._pos = end
            return obj, self._buf[start:end]

    def events_batch(self) -> list[dict[str, Any]] | None:
        """The events from here (the start of one) up to the last event boundary in the buffer, decoded in
        one call; None when there is no boundary or no cut decodes as a list of objects (see _EVENT_BOUNDARY):
        the caller then reads one value, which says what is wrong, if anything."""
        if not self.batching or self._batch_failed:
            return None
        buf, start = self._buf, self._pos
        cuts = [
            m.start() + 1
            for m in _EVENT_BOUNDARY.finditer(buf, max(start, len(buf) - _BOUNDARY_SEARCH_CHARS))
        ]
        self.batch_text = None
        if self.typed_decode is not None and cuts:
            # a cut inside a string or a nested value leaves the text invalid JSON for any decoder, so a
            # batch that decodes is exactly the events up to the cut, as with json below
            text = "[" + buf[start : cuts[-1]] + "]"
            try:
                typed = self.typed_decode(text)
            except (ValueError, RecursionError):
                pass
            else:
                self._drop_to(cuts[-1])
                self.batch_text = text
                return typed
        for _ in range(_BATCH_TRIES):
            if not cuts:
                break
            end = cuts.pop()
            try:
                events = self._decode_whole("[" + buf[start:end] + "]")
            except json.JSONDecodeError as err:
                # a cut inside a string: the error points at the string's start, the event's start is before it
                cuts = [cut for cut in cuts if cut < start + err.pos - 1]
                continue
            except (ValueError, RecursionError):
                break
            if all(type(event) is dict for event in events):
                self._drop_to(end)
                return events
            break
        self._batch_failed = True
        return None


META, EVENTS_START, EVENT, EVENTS_END = range(4)


def trace_items(scanner: JsonScanner) -> Iterator[tuple]:
    """Tagged items of a trace file in file order: (META, key, value, raw), (EVENTS_START,),
    (EVENT, events, raws) for the elements of traceEvents (one event and its source text, or when
    ``scanner.batching`` a batch of events and None, or a batch of typed events and their JSON array's text
    when ``scanner.typed_decode`` decoded it), (EVENTS_END,)."""
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
                yield META, key, value, raw
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


def _event_items(scanner: JsonScanner) -> Iterator[tuple]:
    if scanner.peek() != "[":
        raise scanner.unexpected("traceEvents is not a JSON array")
    scanner.advance()
    yield (EVENTS_START,)
    if scanner.peek() == "]":
        scanner.advance()
    else:
        index = 0
        while True:
            events = scanner.events_batch()
            if events is None:
                event, raw = scanner.value()
                if not isinstance(event, dict):
                    raise scanner.error(f"traceEvents[{index}] is not a JSON object")
                yield EVENT, [event], [raw]
                index += 1
            else:
                yield EVENT, events, scanner.batch_text
                index += len(events)
            separator = scanner.peek()
            if separator not in ("]", ","):
                raise scanner.unexpected("expected ',' or ']' in traceEvents")
            scanner.advance()
            if separator == "]":
                break
    yield (EVENTS_END,)
