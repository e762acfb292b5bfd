"""The typed decoding of traceEvents (msgspec Structs) reads every event as the event-dict reader does: unusual
events (other types, missing fields, NaN, huge numbers, control characters) give the same spans, memory samples
and skipped events, whatever the read chunk's size."""

from __future__ import annotations

import json

import pytest

from lightning_perf.traces.read import reader as traces
from lightning_perf.traces.read.columns import SpanColumns
from lightning_perf.traces.read.event_types import Event
from lightning_perf.traces.read.loader import load_trace
from lightning_perf.traces.read.spans import PYTHON_FUNCTION_CAT, MemorySample, span_of
from lightning_perf.traces.report.build import find_traces

NORMAL = {
    "ph": "X",
    "cat": "kernel",
    "name": "k",
    "ts": 1.5,
    "dur": 2,
    "pid": 0,
    "tid": 7,
    "args": {"correlation": 5, "External id": 3, "grid": [1, 2, 3]},
}
UNUSUAL = [
    {"ph": "X", "cat": "cpu_op", "name": "string ids", "ts": 1, "dur": 1, "pid": "Spans", "tid": "stream 7"},
    {"ph": "X", "cat": "Kernel", "name": "float pid", "ts": 2, "dur": 1, "pid": 1.5, "tid": 1},
    {"ph": "X", "name": "no cat", "ts": 1, "dur": 1},
    {"ph": "X", "cat": "cpu_op", "ts": 1, "dur": 1},
    {"ph": "X", "cat": None, "name": None, "ts": 1, "dur": 1},
    {"ph": "X", "cat": "cpu_op", "name": 5, "ts": 1, "dur": 1},
    {"ph": "X", "cat": "cpu_op", "name": "no ts", "dur": 1},
    {"ph": "X", "cat": "cpu_op", "name": "no dur", "ts": 3},
    {"ph": "X", "cat": "cpu_op", "name": "null dur", "ts": 3, "dur": None},
    {"ph": "X", "cat": "cpu_op", "name": "bool ts", "ts": True, "dur": 1},
    {"ph": "X", "cat": "cpu_op", "name": "huge ts", "ts": 10**400, "dur": 1},
    {"ph": "X", "cat": "cpu_op", "name": "big int ts", "ts": 2**70 + 1, "dur": 1},
    {"ph": "X", "cat": "cpu_op", "name": "nan ts", "ts": float("nan"), "dur": 1},
    {"ph": "X", "cat": "cpu_op", "name": "1e300", "ts": 1e300, "dur": 1},
    {"ph": "X", "cat": "cpu_op", "name": "negative", "ts": 1, "dur": -1},
    {"ph": "X", "cat": "cpu_op", "name": "args list", "ts": 1, "dur": 1, "args": [1, 2]},
    {"ph": "X", "cat": "cpu_op", "name": "string id", "ts": 1, "dur": 1, "args": {"External id": "x"}},
    {
        "ph": "X",
        "cat": "cpu_op",
        "name": "null id",
        "ts": 1,
        "dur": 1,
        "args": {"External id": None, "external id": 4},
    },
    {"ph": "X", "cat": "cpu_op", "name": "lower id", "ts": 1, "dur": 1, "args": {"external id": 4}},
    {"ph": "X", "cat": "cpu_op", "name": "float corr", "ts": 1, "dur": 1, "args": {"correlation": 4.0}},
    {"ph": "X", "cat": "cpu_op", "name": "null args", "ts": 1, "dur": 1, "args": None},
    {"ph": "X", "cat": PYTHON_FUNCTION_CAT, "name": "py", "ts": 1, "dur": 1},
    {
        "ph": "i",
        "name": "[memory]",
        "ts": 5,
        "args": {"Device Type": 1, "Device Id": 0, "Total Allocated": 100},
    },
    {"ph": "i", "name": "[memory]", "ts": 6, "args": {"Device Type": 1, "Bytes": 10}},
    {"ph": "i", "name": "[memory]", "ts": 7, "args": {"Device Type": True, "Device Id": True, "Bytes": 10}},
    {"ph": "i", "name": "[memory]", "ts": 8, "args": {"Device Type": 1, "Device Id": "gpu", "Bytes": 2.5}},
    {"ph": "i", "name": "[memory]", "args": {"Device Type": 1, "Total Allocated": 1}},
    {"ph": "i", "name": "[memory]", "ts": 9, "args": None},
    {"ph": "i", "name": "[memory]", "ts": 9, "args": {"Device Type": 0, "Total Allocated": 1}},
    {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "x"}},
    {"name": "no ph", "ts": 1, "dur": 1},
]
# written by hand: a raw control character in a string (json allows it here, msgspec does not), duplicate keys
RAW_UNUSUAL = [
    '{"ph": "X", "cat": "cpu_op", "name": "control\x01char", "ts": 1, "dur": 1}',
    '{"ph": "X", "cat": "cpu_op", "name": "duplicate", "ts": 1, "ts": 2, "dur": 1}',
]


def write_trace(path, unusual: bool) -> None:
    parts = []
    for i in range(200):
        parts += [json.dumps(dict(NORMAL, ts=NORMAL["ts"] + i))] * 20
        if unusual:
            parts += [json.dumps(e) for e in UNUSUAL] + RAW_UNUSUAL
    path.write_text('{"schemaVersion": 1, "traceEvents": [\n' + ",\n".join(parts) + '\n], "traceName": "t"}')


def add_memory_event(event: dict, memory: list, running: dict) -> bool:
    """The allocator sample of one event dict (torch 1.10+ totals, torch 1.9 changes summed); True for a total."""
    args = event.get("args")
    if not isinstance(args, dict):
        return False
    ts, device = event.get("ts"), args.get("Device Id", 0)
    total, change = args.get("Total Allocated"), args.get("Bytes")
    if not isinstance(ts, (int, float)) or args.get("Device Type") != 1:
        return False
    device = device if isinstance(device, int) else 0
    if isinstance(total, (int, float)):
        memory.append(MemorySample(float(ts), device, float(total)))
        return True
    if isinstance(change, (int, float)):
        running[device] = running.get(device, 0.0) + change
        memory.append(MemorySample(float(ts), device, running[device]))
    return False


def by_event_dicts(path) -> tuple:
    """What load_trace must give, event by event from json's dicts, with span_of (the definition of a span)."""
    events = json.JSONDecoder(strict=False).decode(path.read_text())["traceEvents"]
    spans, memory, running, totals, skipped, reason = [], [], {}, False, 0, None
    for i, event in enumerate(events):
        if event.get("cat") == PYTHON_FUNCTION_CAT:
            continue
        if event.get("name") == "[memory]":
            totals = add_memory_event(event, memory, running) or totals
            continue
        try:
            span = span_of(event)
        except ValueError as err:
            skipped += 1
            reason = reason or f"traceEvents[{i}]: {err}"
            continue
        if span is not None:
            spans.append(span)
    return [repr(s) for s in spans], [repr(m) for m in memory], totals, len(events), skipped, reason


def loaded(path) -> tuple:
    parsed = load_trace(path)
    return (
        [repr(s) for s in parsed.spans],
        [repr(m) for m in parsed.memory],
        parsed.memory_has_totals,
        parsed.event_count,
        parsed.skipped_events,
        parsed.skip_reason,
    )


@pytest.mark.parametrize("chunk_chars", [1 << 20, 4096, 97])
def test_unusual_events_read_as_the_dict_reader_reads_them(tmp_path, monkeypatch, chunk_chars):
    monkeypatch.setattr(traces, "READ_CHUNK_CHARS", chunk_chars)
    path = tmp_path / "unusual.json"
    write_trace(path, unusual=True)
    expected = by_event_dicts(path)
    assert loaded(path) == expected
    assert expected[4] > 0 and len(expected[1]) > 0  # skipped events and memory samples were there to read


def test_usual_events_are_decoded_typed(tmp_path):
    path = tmp_path / "usual.json"
    write_trace(path, unusual=False)
    with traces.TraceReader(path) as reader:
        batches = list(reader.decoded_batches(Event))
    typed = sum(len(events) for events, exact in batches if exact)
    # all but the last event of a read chunk (read alone: no boundary after it in the buffer)
    assert typed >= 4000 - 2 and loaded(path) == by_event_dicts(path)


def test_real_traces_are_mostly_decoded_typed(realtraces):
    (path,) = find_traces(str(realtraces / "ddp_a100_rank1_of2"))
    with traces.TraceReader(path) as reader:
        sizes = [(len(events), exact) for events, exact in reader.decoded_batches(Event)]
    typed = sum(n for n, is_typed in sizes if is_typed)
    assert typed > 0.99 * sum(n for n, _ in sizes)


def test_an_allocator_sample_whose_name_is_written_with_escapes_is_read_as_one(tmp_path):
    """The loader asks the decoded names, not the JSON text, whether an event is an allocator sample."""
    path = tmp_path / "escaped.json"
    write_trace(path, unusual=False)
    sample = (
        '{"ph": "i", "name": "\\u005bmemory]", "ts": 9, "args": {"Device Type": 1, "Total Allocated": 64}}'
    )
    path.write_text(path.read_text().replace("\n]", ",\n" + sample + "\n]"))
    parsed = load_trace(path)
    assert [(m.ts, m.allocated) for m in parsed.memory] == [(9.0, 64.0)] and parsed.memory_has_totals
    assert loaded(path) == by_event_dicts(path)


def same_columns(made, remade) -> bool:
    arrays = ("start", "end", "cat_code", "name_code", "thread_code", "correlation", "external_id")
    return (
        made.cats == remade.cats
        and made.names == remade.names
        and all(
            getattr(made, k).dtype == getattr(remade, k).dtype
            and getattr(made, k).tolist() == getattr(remade, k).tolist()
            for k in arrays
        )
    )


@pytest.mark.parametrize("chunk_chars", [1 << 20, 97])
def test_the_loaders_columns_are_the_columns_of_its_spans(tmp_path, monkeypatch, chunk_chars):
    """load_trace builds the span columns from the lists it decoded, typed batches and dict batches mixed:
    they equal the columns made afterwards from the span tuples, code for code."""
    monkeypatch.setattr(traces, "READ_CHUNK_CHARS", chunk_chars)
    path = tmp_path / "unusual.json"
    write_trace(path, unusual=True)
    parsed = load_trace(path)
    assert len(parsed.spans.columns) == len(parsed.spans) > 4000
    assert same_columns(parsed.spans.columns, SpanColumns.of_spans(list(parsed.spans)))


def test_the_loaders_columns_of_the_real_traces(realtraces):
    paths = [
        path
        for folder in sorted(realtraces.iterdir())
        if folder.is_dir()
        for path in find_traces(str(folder))
    ]
    assert len(paths) == 4
    for path in paths:
        parsed = load_trace(path)
        assert same_columns(parsed.spans.columns, SpanColumns.of_spans(list(parsed.spans))), path


def test_a_sequence_number_beyond_int64_is_none_and_the_rest_stay_typed(tmp_path):
    """An autograd sequence number the int64 column cannot hold reads as none (-1), as a dict event's does; the
    typed decoding of the batch around it used to fail with OverflowError."""
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": i, "dur": 1, "args": {"Sequence number": i}}
        for i in range(50)
    ]
    events[20]["args"]["Sequence number"] = 2**63
    events[21]["args"]["Sequence number"] = -(2**63)
    path = tmp_path / "sequence.json"
    path.write_text(json.dumps({"traceEvents": events}))
    parsed = load_trace(path)
    assert parsed.spans.columns.sequence.tolist() == [*range(20), -1, -(2**63), *range(22, 50)]
    with traces.TraceReader(path) as reader:
        (batch, exact), *_ = reader.decoded_batches(Event)
    assert not exact and len(batch) == 49  # one batch (the last event is read alone), one event a dict
    assert [type(e) is dict for e in batch] == [i == 20 for i in range(49)]
