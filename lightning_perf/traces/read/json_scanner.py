"""Whole JSON values, and batches of trace events, out of a text stream read in chunks: the tokenizer under
:class:`~lightning_perf.traces.read.reader.TraceReader`.

:class:`JsonScanner` keeps one read chunk (and the value it cuts) in memory; :func:`trace_items` walks the top
level of a Chrome trace with it. The events of ``traceEvents`` are decoded by msgspec, a batch (up to a chunk's
worth) at a time, into one type (the typed :class:`~lightning_perf.traces.read.event_types.Event` or dicts); an
event that type cannot hold is decoded alone into :mod:`json`'s dict, and what msgspec cannot read at all (NaN,
control characters in strings) one value at a time by :mod:`json`, which also makes the error messages.
Standard library and msgspec (and the gzip errors of :mod:`~lightning_perf.traces.read.gunzip`).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from typing import IO, Any

import msgspec

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
# buffer are decoded with one call of msgspec's decoder (no Python step per event). A match inside a
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
        # msgspec's decoders of a batch of events and of one, once events are read in batches (the rewrite
        # reads them one by one with json, for their exact source text)
        self._decoders: tuple[msgspec.json.Decoder[Any], msgspec.json.Decoder[Any]] | None = None
        # no cut of this buffer decoded: one value at a time until the next fill
        self._batch_failed = False
        # the last batch's events are all of the decoded type (else some are json's dicts)
        self.batch_exact = False

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

    def decode_events_as(self, event_type: Any) -> None:
        """Read the events of traceEvents in batches from now on, each event decoded by msgspec into
        ``event_type`` (a Struct, or ``dict[str, Any]``); see :meth:`events_batch`."""
        self._decoders = _decoders(event_type)

    def events_batch(self) -> list[Any] | None:
        """The events from here (the start of one) up to the last event boundary in the buffer, decoded by
        msgspec: the whole batch in one call into the event type (``batch_exact`` then True), or, where some
        event does not fit the type (a value of another type), event by event, with :mod:`json`'s dict for each
        event that does not fit. None when there is no boundary, or no cut decodes (see _EVENT_BOUNDARY; also
        NaN, a control character in a string, a number beyond a float, which msgspec does not read): the caller
        then reads one value with :mod:`json`, which says what is wrong, if anything."""
        if self._decoders is None or self._batch_failed:
            return None
        buf, start = self._buf, self._pos
        cuts = [
            m.start() + 1
            for m in _EVENT_BOUNDARY.finditer(buf, max(start, len(buf) - _BOUNDARY_SEARCH_CHARS))
        ]
        for end in cuts[: -_BATCH_TRIES - 1 : -1]:  # the last cuts first: the longest batches
            events = self._decode_batch(f"[{buf[start:end]}]")  # one copy of the text fewer than +
            if events is not None:
                self._drop_to(end)
                return events
        self._batch_failed = True
        return None

    def _decode_batch(self, text: str) -> list[Any] | None:
        batch_decoder, event_decoder = self._decoders  # type: ignore[misc]
        try:
            events = batch_decoder.decode(text)
        except msgspec.ValidationError:
            pass  # well-formed, but some event does not fit the type: event by event below
        except (ValueError, RecursionError):
            return None  # malformed for msgspec: a cut inside a string, or a value only json reads
        else:
            self.batch_exact = True
            return events
        self.batch_exact = False
        try:
            raws = _RAW_EVENTS.decode(text)
        except (ValueError, RecursionError):  # malformed after the event that did not fit
            return None
        events = []
        for raw in raws:
            try:
                events.append(event_decoder.decode(raw))
            except msgspec.ValidationError:
                try:
                    event = self._decode_whole(bytes(raw).decode())
                except (
                    ValueError,
                    RecursionError,
                ):  # beyond json's digits limit: one value at a time says so
                    return None
                if type(event) is not dict:  # one value at a time names it
                    return None
                events.append(event)
        return events


@functools.cache
def _decoders(event_type: Any) -> tuple[msgspec.json.Decoder[Any], msgspec.json.Decoder[Any]]:
    """The decoders of a batch of ``event_type`` and of one (building a Decoder is the slow part: once a type)."""
    return msgspec.json.Decoder(list[event_type]), msgspec.json.Decoder(event_type)


# the elements of a JSON array as their exact text: where a batch does not fit the type, event by event
_RAW_EVENTS = msgspec.json.Decoder(list[msgspec.Raw])


META, EVENTS_START, EVENT, EVENTS_END = range(4)


def trace_items(scanner: JsonScanner) -> Iterator[tuple]:
    """Tagged items of a trace file in file order: (META, key, value, raw), (EVENTS_START,),
    (EVENT, events, raws) for the elements of traceEvents (one event dict and its source text, or, once
    :meth:`JsonScanner.decode_events_as` was called, a batch of events and None), (EVENTS_END,)."""
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
                yield EVENT, events, None
                index += len(events)
            separator = scanner.peek()
            if separator not in ("]", ","):
                raise scanner.unexpected("expected ',' or ']' in traceEvents")
            scanner.advance()
            if separator == "]":
                break
    yield (EVENTS_END,)
