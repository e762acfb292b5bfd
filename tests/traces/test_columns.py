"""The walks over span columns against the span-by-span loops they replaced (main at 2cbb404), on Hypothesis'
spans: nested, touching, zero-length and improperly nested ones (real traces have them: torch-tb-profiler
complains of "ranges on the same thread should not intersect" on ddp_a100_rank0), ties in start and end, two
threads. Exact equality: same issuers, same operator totals to the last bit."""

from __future__ import annotations

import gc
import weakref
from collections import defaultdict
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_perf.traces.figures.analysis import cpu_operator_stats
from lightning_perf.traces.figures.breakdown import _pairs_by_dict, _pairs_by_sort, step_breakdown
from lightning_perf.traces.figures.host_calls import Issuer, issuing_operators
from lightning_perf.traces.figures.intervals import union_of
from lightning_perf.traces.read import columns
from lightning_perf.traces.read.columns import columns_of
from lightning_perf.traces.read.loader import load_trace
from lightning_perf.traces.read.spans import (
    OPERATOR_CATS,
    PROFILER_STEP_PREFIX,
    RUNTIME_CATS,
    TIME_TOLERANCE_US,
    Span,
    SpanList,
)
from lightning_perf.traces.report.build import analyse_trace, find_traces

NAMES = ["aten::mm", "aten::add", "record", "ProfilerStep#3", "cudaLaunchKernel", "cudaMemcpyAsync"]
CATS = ["cpu_op", "user_annotation", "cuda_runtime", "kernel", "python"]

span = st.builds(
    lambda name, cat, start, length, pid, tid, corr: Span(
        name, cat, start / 4, (start + length) / 4, pid, tid, None, corr
    ),
    st.sampled_from(NAMES),
    st.sampled_from(CATS),
    st.integers(0, 20),  # a coarse grid: many spans share a start or an end
    st.integers(0, 6),
    st.sampled_from([1, "Spans"]),
    st.sampled_from([7, 8]),
    st.one_of(st.none(), st.integers(0, 5)),
)


def loop_issuers(spans: list[Span]) -> dict[int, Issuer]:
    """issuing_operators as it was: per-thread lists, two stable sorts, a stack of spans (by index)."""
    operators: dict[Any, list[int]] = defaultdict(list)
    calls: dict[Any, list[int]] = defaultdict(list)
    for i, s in enumerate(spans):
        if s.cat in OPERATOR_CATS:
            if not s.name.startswith(PROFILER_STEP_PREFIX):
                operators[s[4:6]].append(i)
        elif s.cat in RUNTIME_CATS:
            calls[s[4:6]].append(i)
    found = {}
    for thread, thread_calls in calls.items():
        items = operators.get(thread, []) + thread_calls
        items.sort(key=lambda i: spans[i].end, reverse=True)
        items.sort(key=lambda i: spans[i].start)
        stack: list[Span] = []
        for i in items:
            s = spans[i]
            while stack and stack[-1].end <= s.start + TIME_TOLERANCE_US:
                stack.pop()
            if s.cat not in RUNTIME_CATS:
                stack.append(s)
                continue
            pair = (None, None)
            for op in reversed(stack):
                if op.end + TIME_TOLERANCE_US >= s.end:
                    outer = next(o for o in stack if o.end + TIME_TOLERANCE_US >= s.end)
                    pair = (op.name, outer.name)
                    break
            found[i] = Issuer(*pair)
    return found


def loop_operator_stats(spans: list[Span]) -> list[tuple]:
    """cpu_operator_stats as it was: a stack walk per thread, each span's totals added as it ends."""
    by_thread: dict[Any, list[Span]] = defaultdict(list)
    for s in spans:
        if s.cat in OPERATOR_CATS or s.cat == "user_annotation":
            by_thread[s[4:6]].append(s)
    totals: dict[str, list[Any]] = {}

    def finish(done: Span, self_us: float) -> None:
        if done.name.startswith(PROFILER_STEP_PREFIX):
            return
        total = totals.setdefault(done.name, [0, 0.0, 0.0])
        total[0] += 1
        total[1] += max(self_us, 0.0)
        total[2] += done.end - done.start

    for thread_spans in by_thread.values():
        thread_spans.sort(key=lambda s: s.end, reverse=True)
        thread_spans.sort(key=lambda s: s.start)
        stack: list[list[Any]] = []
        for s in thread_spans:
            while stack and stack[-1][0] <= s.start + TIME_TOLERANCE_US:
                _, self_us, done = stack.pop()
                finish(done, self_us)
            if stack and s.end <= stack[-1][0] + TIME_TOLERANCE_US:
                stack[-1][1] -= s.end - s.start
            stack.append([s.end, s.end - s.start, s])
        for _, self_us, done in stack:
            finish(done, self_us)
    return sorted(((n, *t) for n, t in totals.items()), key=lambda t: t[2], reverse=True)


@settings(max_examples=300, deadline=None)
@given(st.lists(span, max_size=40))
def test_the_issuer_walk_over_columns_finds_the_operators_of_the_loop(spans):
    assert issuing_operators(SpanList(spans)) == loop_issuers(spans)


@settings(max_examples=300, deadline=None)
@given(st.lists(span, max_size=40))
def test_the_operator_table_over_columns_is_the_loops_to_the_last_bit(spans):
    stats = [(s.name, s.calls, s.self_us, s.total_us) for s in cpu_operator_stats(SpanList(spans))]
    assert stats == loop_operator_stats(spans)


def test_masks_and_kinds_are_decided_once_per_distinct_value_and_spread_over_the_spans():
    spans = SpanList(
        [Span("a", "kernel", 0.0, 1.0, 1, 1, None, 4), Span("b", "cpu_op", 0.5, 2.0, 1, 2, 7, None)] * 3
    )
    cols = columns_of(spans)
    assert cols is columns_of(spans)  # made once for the loader's list
    asked = []
    assert cols.where_name(lambda name: asked.append(name) or name == "b").tolist() == [False, True] * 3
    assert asked == ["a", "b"]
    assert cols.in_cats({"kernel"}).tolist() == [True, False] * 3
    assert cols.classify(lambda cat, name: len(cat) + len(name)).tolist() == [7, 7] * 3
    assert cols.correlation.tolist() == [4, None] * 3 and cols.has_correlation.tolist() == [True, False] * 3
    assert union_of(cols, cols.in_cats({"cpu_op"})).as_ranges() == [(0.5, 2.0)]
    assert np.unique(cols.thread_code).size == 2


def test_classify_by_table_and_by_sort_give_the_same_kinds(realtraces, monkeypatch):
    # the table of (category, name) pairs, and np.unique's sort where that table would be sparse
    (path,) = find_traces(str(realtraces / "ddp_a100_rank1_of2"))
    spans = load_trace(path).spans
    cols = columns_of(spans)

    def kind_of(cat: str, name: str) -> int:
        return (len(cat) * 31 + len(name)) % 97

    by_table = cols.classify(kind_of)
    monkeypatch.setattr(columns, "_TABLE_SPANS", 0)
    monkeypatch.setattr(columns, "_TABLE_FLOOR", 0)
    by_sort = cols.classify(kind_of)
    assert by_table.dtype == by_sort.dtype == np.int8
    assert by_table.tolist() == by_sort.tolist() == [kind_of(s.cat, s.name) for s in spans]
    assert cols.where(lambda cat, name: cat == "kernel").tolist() == [s.cat == "kernel" for s in spans]


def test_a_dropped_trace_is_freed_without_the_cyclic_collector(realtraces):
    # the span list holds its columns, the columns only a weak link back: no cycle keeps ~1e5 spans alive
    # until the collector's next pass (it was 17 ms a trace); the columns alone still give the spans' tuples
    (path,) = find_traces(str(realtraces / "resnet50_v100_workers0"))
    gc.disable()
    try:
        parsed = load_trace(path)
        cols = columns_of(parsed.spans)
        assert cols is parsed.columns and cols.spans is parsed.spans
        kernels = [s for s in parsed.spans if s.cat == "kernel"]
        alive = weakref.ref(parsed.spans)
        del parsed
        assert alive() is None
        assert cols.picked(cols.in_cats({"kernel"})) == kernels
    finally:
        gc.enable()


def test_the_report_reads_the_columns_without_making_span_tuples(realtraces, monkeypatch):
    """analyse_trace reads the loader's columns only: no span list is made (building ~1e5 tuples was a tenth
    of reading a trace); ParsedTrace.spans makes the list when asked, once, from the columns, tuple for tuple
    what the columns give as a sequence of spans."""
    made: list[int] = []
    make = SpanList.__init__

    def counting(self: SpanList, *args: Any) -> None:
        made.append(len(args))
        make(self, *args)

    monkeypatch.setattr(SpanList, "__init__", counting)
    (path,) = find_traces(str(realtraces / "ddp_a100_rank1_of2"))
    section = analyse_trace(path)
    assert section["top_cpu_operators"] and section["process"] is not None
    assert made == []
    parsed = load_trace(path)
    spans = parsed.spans
    assert len(made) == 1 and parsed.spans is spans and len(spans) == len(parsed.columns) > 60_000
    cols = parsed.columns
    assert cols[0] == spans[0] and cols[-1] == spans[-1] and cols[5:9] == spans[5:9]
    assert section["process"] == next(s.pid for s in spans if s.name.startswith("ProfilerStep#"))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 12), st.integers(0, 4)), max_size=40),
    st.lists(st.integers(0, 14), max_size=40),
)
def test_pairs_joined_by_sorting_are_the_dicts_pairs(calls, work_ids):
    # (call's correlation id, its step); GPU activities' ids: repeated ids on both sides, ids with no match
    call_ids = np.array([c for c, _ in calls], dtype=np.int64)
    call_steps = np.array([s for _, s in calls], dtype=np.int64)
    work = np.arange(100, 100 + len(work_ids), dtype=np.int64)
    by_sort = _pairs_by_sort(call_ids, call_steps, work, np.array(work_ids, dtype=np.int64))
    by_dict = _pairs_by_dict(call_ids.tolist(), call_steps, work, work_ids)
    linked, steps = by_sort
    assert len(linked) == len(steps)
    pairs = sorted(zip(linked.tolist(), steps.tolist(), strict=True))
    assert pairs == sorted(zip(by_dict[0].tolist(), by_dict[1].tolist(), strict=True))
    # every pair is a real match: the activity's id is its call's id
    expected = sorted(
        (w, s) for w, i in zip(work.tolist(), work_ids, strict=True) for c, s in calls if c == i
    )
    assert pairs == expected


def test_the_step_alignment_is_the_same_whatever_the_type_of_the_ids(realtraces):
    # int ids are joined by sorting; the same ids as floats (which the dict reader may keep) through dicts
    (path,) = find_traces(str(realtraces / "ddp_a100_rank1_of2"))
    spans = load_trace(path).spans
    as_floats = SpanList(
        s if s.correlation is None else s._replace(correlation=float(s.correlation)) for s in spans
    )
    assert columns_of(spans).correlation_ids is not None
    assert columns_of(as_floats).correlation_ids is None
    by_sort, by_dict = step_breakdown(spans), step_breakdown(as_floats)
    assert by_sort.device_aligned and by_sort.dropped_tail_steps == by_dict.dropped_tail_steps
    assert [s.__dict__ for s in by_sort.steps] == [s.__dict__ for s in by_dict.steps]
