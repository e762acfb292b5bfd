"""A trace's spans as numpy columns: the filters and interval sums of the analyses without a Python step a span.

:func:`columns_of` gives the :class:`SpanColumns` of a list of :class:`~lightning_perf.traces.read.spans.Span`
tuples (start, end, category and name codes, threads and ids): for a list that
:func:`~lightning_perf.traces.read.loader.load_trace` made, the columns it built from the lists it decoded; for
any other, columns made from the tuples in C loops (``map`` over ``itemgetter``; about 30 ns a span and column).
A question about a category or a name ("is it a kernel", "is it NCCL") is then asked once per distinct value, a
few hundred, and spread over the spans by indexing.

The loader's columns come without span tuples: the analyses read the columns, and the few spans they pick out as
tuples (:meth:`SpanColumns.picked`) are made from them, the same tuples the list holds. The whole list is made the
first time something asks for it (:attr:`SpanColumns.spans`, ``ParsedTrace.spans``): building ~1e5 tuples was a
tenth of reading a trace. The columns are a sequence of the spans too, so an analysis that takes spans takes them.
"""

from __future__ import annotations

import functools
import itertools
import json
import operator
import weakref
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Mapping, Sequence
from itertools import repeat
from typing import Any, overload

import numpy as np

from lightning_perf.traces.read.spans import (
    PROFILER_STEP_PREFIX,
    Span,
    SpanList,
    StepSpan,
    as_spans,
    step_spans,
)

# classify's table of (category, name) pairs is used while it has at most this many entries a span (plus the
# floor): a few hundred names and a dozen categories make a table far smaller than the spans
_TABLE_SPANS, _TABLE_FLOOR = 4, 1 << 16
_NAME, _CAT, _START, _END, _PID, _TID, _EXTERNAL_ID, _CORRELATION = (operator.itemgetter(i) for i in range(8))
_new_tuple = tuple.__new__  # a Span without the Python-level __new__ of NamedTuple (same tuple)


class SpanColumns(Sequence[Span]):
    """The spans' fields the vectorised analyses read, index for index with the span list; as a sequence, the
    spans themselves (the tuples of :attr:`spans`).

    Made by a :class:`ColumnsBuilder`: by :meth:`of_spans` from the tuples, or by the loader from the lists it
    decoded (the same values and codes: each code is the value's place in first-seen order; ``spans`` None:
    the tuples are made from the columns when asked for)."""

    def __init__(
        self,
        spans: list[Span] | None,
        start: np.ndarray,
        end: np.ndarray,
        cats: list[str],
        cat_code: np.ndarray,
        names: list[str],
        name_code: np.ndarray,
        thread_code: np.ndarray,
        external_id: np.ndarray,
        correlation: np.ndarray,
        input_type_code: np.ndarray | None = None,
        input_types: list[tuple[str, ...] | None] | None = None,
        sequence: np.ndarray | None = None,
        pid: np.ndarray | None = None,
        tid: np.ndarray | None = None,
    ) -> None:
        # a SpanList holds its columns (columns_of): the link back is weak, so dropping a trace frees both
        # at once by reference counting, not by a pass of the cyclic collector over every span (17 ms of a
        # 68k-span trace)
        self._spans: Callable[[], list[Span] | None] = (
            weakref.ref(spans) if type(spans) is SpanList else lambda: spans
        )
        # the spans' pid and tid as written (object arrays): with the other columns, each span's tuple
        self.pid, self.tid = pid, tid
        self.start, self.end = start, end
        self.cats, self.cat_code = cats, cat_code
        self.names, self.name_code = names, name_code
        # each span's thread, (pid, tid), as a number that differs between threads
        self.thread_code = thread_code
        self.external_id = external_id  # object arrays: None where the span has none
        self.correlation = correlation
        # the input types (``Input type``, traces recorded with shapes) of each tensor-core-eligible operator as a
        # code into ``input_types``, the distinct tuples; code 0 is None: no types (every other span, and every
        # span of columns made from tuples)
        self.input_type_code = (
            np.zeros(len(start), dtype=np.int32) if input_type_code is None else input_type_code
        )
        self.input_types = [None] if input_types is None else input_types
        # each operator's autograd sequence number (int64), -1 where it has none: links a backward operator to
        # the forward one whose node it runs (traces.figures.modules)
        self.sequence = np.full(len(start), -1, dtype=np.int64) if sequence is None else sequence

    @property
    def spans(self) -> list[Span]:
        """The span list these are the columns of; for the loader's columns, made from them the first time
        (and again once the list made is dropped: it is held by whoever asked, as ``ParsedTrace.spans``)."""
        spans = self._spans()
        if spans is None:
            if self.pid is None or self.tid is None:
                raise RuntimeError(
                    "the span list of these columns is gone: keep the list while using its columns"
                )
            spans = self._span_list()
        return spans

    def _span_list(self) -> SpanList:
        """Every span's tuple, made from the columns (C loops), as the list that holds these columns."""
        spans = SpanList(self._tuples(np.arange(len(self))))
        spans.columns = self
        self._spans = weakref.ref(spans)
        return spans

    def _tuples(self, indices: np.ndarray) -> Iterator[Span]:
        """The Span tuples of ``indices``, made from the columns: the loader's tuples, value for value (the
        names and categories the interned strings it coded, the times the floats of the arrays, pid, tid and
        ids the objects it decoded)."""
        assert self.pid is not None and self.tid is not None  # the loader's columns, or of_spans's
        fields = zip(
            map(self.names.__getitem__, self.name_code[indices].tolist()),
            map(self.cats.__getitem__, self.cat_code[indices].tolist()),
            self.start[indices].tolist(),
            self.end[indices].tolist(),
            self.pid[indices].tolist(),
            self.tid[indices].tolist(),
            self.external_id[indices].tolist(),
            self.correlation[indices].tolist(),
            strict=True,
        )
        return map(_new_tuple, repeat(Span), fields)

    @overload
    def __getitem__(self, index: int) -> Span: ...

    @overload
    def __getitem__(self, index: slice) -> list[Span]: ...

    def __getitem__(self, index: int | slice) -> Span | list[Span]:
        if isinstance(index, slice):
            return self.picked(np.arange(len(self))[index])
        return self.picked(np.array([range(len(self))[index]]))[0]

    def __iter__(self) -> Iterator[Span]:
        return iter(self.spans)

    @classmethod
    def of_spans(cls, spans: list[Span]) -> SpanColumns:
        """The columns of Span tuples, in C loops (``map`` over ``itemgetter``)."""
        builder = ColumnsBuilder()
        builder.add_spans(spans)
        return builder.columns(spans)

    def __len__(self) -> int:
        return len(self.start)

    @functools.cached_property
    def has_correlation(self) -> np.ndarray:
        return _not_none(self.correlation)

    @functools.cached_property
    def correlation_ids(self) -> np.ndarray | None:
        """The correlation ids as int64 where :attr:`has_correlation` (0 elsewhere), for joins by sorting; None
        when one is not a plain int within int64 (the dict reader keeps any JSON value: a float, a string, a
        bool), and callers then match ids through dicts."""
        present = self.correlation[self.has_correlation]
        if not set(map(type, present.tolist())) <= {int}:
            return None
        ids = np.zeros(len(self), dtype=np.int64)
        try:
            ids[self.has_correlation] = present.astype(np.int64)
        except OverflowError:
            return None
        return ids

    def nesting_order(
        self, mask: np.ndarray, before: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The spans of ``mask`` in the order a walk of their nesting reads them: thread by thread (in the order
        each thread first appears), by start, the longer (enclosing) span first, then ``before`` (spans with
        the smaller value first), then file order. Returns the span indices and each one's thread (its rank)."""
        chosen = np.flatnonzero(mask)
        codes = self.thread_code[chosen]
        distinct, first = np.unique(codes, return_index=True)
        place = np.empty(len(distinct), dtype=np.int64)  # each thread's place in first-seen order
        place[np.argsort(first, kind="stable")] = np.arange(len(distinct))
        rank = place[np.searchsorted(distinct, codes)]
        keys = [chosen] if before is None else [chosen, before[chosen]]
        order = np.lexsort((*keys, -self.end[chosen], self.start[chosen], rank))
        return chosen[order], rank[order]

    def in_cats(self, cats: Collection[str]) -> np.ndarray:
        """Mask of the spans whose (lower-cased) category is one of ``cats``."""
        table = np.fromiter((cat in cats for cat in self.cats), bool, len(self.cats))
        return table[self.cat_code]

    def where_name(self, predicate: Callable[[str], bool]) -> np.ndarray:
        """Mask of the spans whose name satisfies ``predicate`` (asked once per distinct name)."""
        table = np.fromiter(map(predicate, self.names), bool, len(self.names))
        return table[self.name_code]

    def where(self, predicate: Callable[[str, str], bool]) -> np.ndarray:
        """Mask of the spans for which ``predicate(category, name)`` holds (asked once per distinct pair)."""
        return self.classify(lambda cat, name: bool(predicate(cat, name)), bool)

    def classify(self, kind_of: Callable[[str, str], Any], dtype: Any = np.int8) -> np.ndarray:
        """``kind_of(category, name)`` of every span, as an array of ``dtype`` (decided once per distinct pair)."""
        if len(self) == 0:
            return np.empty(0, dtype=dtype)
        pairs = len(self.cats) * len(self.names)
        pair = self.cat_code.astype(np.int64) * len(self.names) + self.name_code
        if pairs > _TABLE_SPANS * len(self) + _TABLE_FLOOR:  # a sparse table: sorting is cheaper
            distinct, inverse = np.unique(pair, return_inverse=True)
            return np.array(self._kinds(kind_of, distinct), dtype=dtype)[inverse.reshape(-1)]
        # a table over every (category, name) pair: no sort (np.unique's return_inverse was 5 ms of 68k spans)
        present = np.zeros(pairs, dtype=bool)
        present[pair] = True
        distinct = np.flatnonzero(present)
        table = np.zeros(pairs, dtype=dtype)
        table[distinct] = self._kinds(kind_of, distinct)
        return table[pair]

    def _kinds(self, kind_of: Callable[[str, str], Any], pairs: np.ndarray) -> list[Any]:
        """``kind_of`` of each (category code * len(names) + name code) of ``pairs``."""
        cats, names = np.divmod(pairs, len(self.names))
        return [
            kind_of(self.cats[c], self.names[m]) for c, m in zip(cats.tolist(), names.tolist(), strict=True)
        ]

    def picked(self, chosen: np.ndarray) -> list[Span]:
        """The span tuples of ``chosen`` (a mask, or span indices), in order; made from the columns where the
        list has not been made."""
        indices = np.flatnonzero(chosen) if chosen.dtype == bool else chosen
        spans = self._spans()
        if spans is None and self.pid is not None:
            return list(self._tuples(indices))
        return list(map(self.spans.__getitem__, indices.tolist()))


def _not_none(values: np.ndarray) -> np.ndarray:
    return np.fromiter(map(operator.is_not, values, itertools.repeat(None)), bool, len(values))


def thread_code(pid_code: np.ndarray, tid_code: np.ndarray) -> np.ndarray:
    """One number a (pid, tid) pair from the codes of the two: pid * (largest tid code + 1) + tid."""
    pid, tid = pid_code.astype(np.int64), tid_code.astype(np.int64)
    return pid * (int(tid.max(initial=0)) + 1) + tid


class Codebook:
    """Each value's code: its place among the distinct values in first-seen order, over any number of lists
    (the loader codes its columns a batch at a time)."""

    def __init__(self) -> None:
        self.index: dict[Any, int] = {}

    def codes(self, values: list[Any]) -> np.ndarray:
        index = self.index
        try:  # the common batch, once the first ones are coded: every value known, one pass
            return np.fromiter(map(index.__getitem__, values), np.int32, len(values))
        except (KeyError, TypeError):  # a new value (or one that is not hashable): coded below
            pass
        try:
            distinct = dict.fromkeys(values)
        except TypeError:  # a malformed trace's list or object where a pid or tid belongs: coded by its text
            values = [value if isinstance(value, Hashable) else repr(value) for value in values]
            distinct = dict.fromkeys(values)
        new = [value for value in distinct if value not in index]
        index.update(zip(new, range(len(index), len(index) + len(new)), strict=True))
        return np.fromiter(map(index.__getitem__, values), np.int32, len(values))

    def values(self) -> list[Any]:
        return list(self.index)


class ColumnsBuilder:
    """:class:`SpanColumns` a batch of spans at a time (the loader adds each batch as it decodes it): the
    values coded over all batches, the arrays joined once at the end."""

    def __init__(self) -> None:
        self._start: list[np.ndarray] = []
        self._end: list[np.ndarray] = []
        self._name_code: list[np.ndarray] = []
        self._cat_code: list[np.ndarray] = []
        self._pid_code: list[np.ndarray] = []
        self._tid_code: list[np.ndarray] = []
        self._external_id: list[Any] = []
        self._correlation: list[Any] = []
        self._input_type_code: list[np.ndarray] = []
        self._names, self._cats, self._pids, self._tids = Codebook(), Codebook(), Codebook(), Codebook()
        self._input_types = Codebook()
        self._input_types.codes([None])  # code 0: no input types
        self._sequence: list[np.ndarray] = []
        self._pid: list[Any] = []
        self._tid: list[Any] = []

    def add(
        self,
        start: np.ndarray,
        end: np.ndarray,
        *fields: list[Any],
        input_types: tuple[list[int], list[Any]] | None = None,
        sequences: list[int] | None = None,
        name_codes: np.ndarray | None = None,
    ) -> None:
        """One batch: its start and end times, then the lists of its names, categories, pids, tids, external
        ids and correlation ids (the Span fields in order). ``input_types``: (indices in the batch, their input
        types), for the spans that have them: a tuple of strings, or the JSON text as bytes. ``name_codes``:
        what :meth:`name_codes` gave for ``names``, where the caller has them."""
        names, cats, pids, tids, external_ids, correlations = fields
        codes = np.zeros(len(start), dtype=np.int32)
        if input_types is not None and input_types[0]:
            codes[input_types[0]] = self._input_types.codes(input_types[1])
        self._input_type_code.append(codes)
        self._sequence.append(
            np.full(len(start), -1, dtype=np.int64)
            if sequences is None
            else np.array(sequences, dtype=np.int64)
        )
        self._start.append(start)
        self._end.append(end)
        self._name_code.append(self._names.codes(names) if name_codes is None else name_codes)
        self._cat_code.append(self._cats.codes(cats))
        self._pid_code.append(self._pids.codes(pids))
        self._tid_code.append(self._tids.codes(tids))
        self._external_id.extend(external_ids)
        self._correlation.extend(correlations)
        self._pid.extend(pids)
        self._tid.extend(tids)

    def name_codes(self, names: list[str]) -> np.ndarray:
        """The codes of ``names`` (new ones coded in first-seen order), before :meth:`add` takes them."""
        return self._names.codes(names)

    def names(self, start: int = 0) -> list[str]:
        """The names coded so far, from code ``start`` on."""
        return list(itertools.islice(self._names.index, start, None))

    def add_spans(
        self,
        spans: list[Span],
        input_types: tuple[list[int], list[Any]] | None = None,
        sequences: list[int] | None = None,
    ) -> None:
        """One batch of span tuples (and input types and sequence numbers, as :meth:`add` takes them)."""
        n = len(spans)
        self.add(
            np.fromiter(map(_START, spans), np.float64, n),
            np.fromiter(map(_END, spans), np.float64, n),
            *(list(map(field, spans)) for field in (_NAME, _CAT, _PID, _TID, _EXTERNAL_ID, _CORRELATION)),
            input_types=input_types,
            sequences=sequences,
        )

    def columns(self, spans: list[Span] | None) -> SpanColumns:
        """The columns of every batch added, for ``spans``: the span tuples of those batches, in order (None:
        the tuples are made from the columns when asked for)."""
        n = len(self._external_id)
        return SpanColumns(
            spans,
            _joined(self._start, np.float64),
            _joined(self._end, np.float64),
            self._cats.values(),
            _joined(self._cat_code, np.int32),
            self._names.values(),
            _joined(self._name_code, np.int32),
            thread_code(_joined(self._pid_code, np.int32), _joined(self._tid_code, np.int32)),
            np.fromiter(self._external_id, object, n),
            np.fromiter(self._correlation, object, n),
            _joined(self._input_type_code, np.int32),
            list(map(_type_names, self._input_types.values())),
            _joined(self._sequence, np.int64),
            np.fromiter(self._pid, object, n),
            np.fromiter(self._tid, object, n),
        )


def _type_names(value: Any) -> tuple[str, ...] | None:
    """An ``Input type`` as coded (a tuple, or the JSON text as bytes) as a tuple of strings; None for anything
    else (a trace's bad value is no types, never an error)."""
    if isinstance(value, bytes):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, (list, tuple)) or not all(isinstance(name, str) for name in value):
        return None
    return tuple(value)


def _joined(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)


def columns_of(spans: Iterable[Mapping[str, Any] | Span]) -> SpanColumns:
    """The columns of ``spans``: ``spans`` itself when it is columns already (what ``ParsedTrace.columns``
    gives); made once for a span list (kept on the list), else each call."""
    if isinstance(spans, SpanColumns):
        return spans
    if type(spans) is SpanList:
        cached = getattr(spans, "columns", None)
        if cached is None or len(cached) != len(spans):
            cached = spans.columns = SpanColumns.of_spans(spans)
        return cached
    return SpanColumns.of_spans(as_spans(spans))


def host_steps(spans: Iterable[Mapping[str, Any] | Span]) -> list[StepSpan]:
    """:func:`~lightning_perf.traces.read.spans.step_spans`, looking only at the spans named ProfilerStep#."""
    cols = columns_of(spans)
    return step_spans(cols.picked(cols.where_name(lambda name: name.startswith(PROFILER_STEP_PREFIX))))
