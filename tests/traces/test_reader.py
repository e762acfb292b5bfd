"""Trace reading and rewriting (``traces.py``), on traces from real torch.profiler runs and broken files."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import tracemalloc

import pytest
import torch

from lightning_perf.traces.figures import analysis as trace_analysis
from lightning_perf.traces.read import reader as traces
from lightning_perf.traces.read.reader import TraceError
from tests.helpers import DATALOADER, plugin_profile, profile_tiny_loop


@pytest.fixture(scope="module")
def real_trace(tmp_path_factory: pytest.TempPathFactory) -> str:
    (path,) = profile_tiny_loop(str(tmp_path_factory.mktemp("real")))
    return path


def load_json(path: str) -> dict:
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as fh:
        return json.load(fh)


# --------------------------------------------------------------------------------------------------------
# Reader
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk_chars", [traces.READ_CHUNK_CHARS, 7])
@pytest.mark.parametrize("compressed", [True, False])
def test_reader_yields_what_json_load_parses(real_trace, tmp_path, monkeypatch, chunk_chars, compressed):
    # 7-character chunks cut every value and token somewhere: the reader must stitch them back
    monkeypatch.setattr(traces, "READ_CHUNK_CHARS", chunk_chars)
    path = real_trace
    if not compressed:
        path = str(tmp_path / "plain.pt.trace.json")
        with gzip.open(real_trace, "rb") as src, open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)
    expected = load_json(real_trace)
    with traces.TraceReader(path) as reader:
        assert "schemaVersion" in reader.metadata  # known before the events
        events = list(reader.events())
    assert events == expected.pop("traceEvents")
    assert reader.metadata == expected  # complete after the events, traceName (written after them) included
    assert traces.read_metadata(path) == expected


def test_reader_memory_does_not_grow_with_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(traces, "READ_CHUNK_CHARS", 1 << 16)  # smaller chunks, so a smaller file shows it
    path = str(tmp_path / "big.pt.trace.json.gz")
    event = '{"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 1, "ts": %d.5, "dur": 3.25, "args": {"External id": %d, "Input Dims": [[256, 1024], [1024, 1024]]}}'  # noqa: E501
    with gzip.open(path, "wt", compresslevel=1) as fh:
        fh.write('{"schemaVersion": 1, "traceEvents": [\n')
        fh.write(",\n".join(event % (i, i) for i in range(40_000)))
        fh.write("\n]}\n")
        size = fh.tell()
    tracemalloc.start()
    try:
        count = sum(1 for _ in traces.iter_events(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == 40_000
    # a decompressed copy alone would be `size` bytes, the parsed event list several times that
    assert size > 6e6
    assert peak < size / 5


# events whose strings and nested values hold what an event boundary looks like ("}, {"): a batch cut there
# does not decode, and those events are read one at a time
_TRICKY_EVENTS = [
    {"ph": "X", "name": 'fn({"a": 1}, {"b": 2})', "cat": "python_function", "ts": 1, "dur": 2},
    {
        "ph": "X",
        "name": "k",
        "cat": "kernel",
        "ts": 3,
        "dur": 1,
        "args": {"shapes": [{"a": 1}, {"b": [{}, {}]}]},
    },
    {"ph": "i", "name": "a}, {b", "s": "t", "ts": 5, "args": {"text": "}\n,\t{ \\"}},
]


@pytest.mark.parametrize("chunk_chars", [1 << 20, 256, 97, 7])
def test_batches_yield_what_json_load_parses(tmp_path, monkeypatch, chunk_chars):
    monkeypatch.setattr(traces, "READ_CHUNK_CHARS", chunk_chars)
    events = [dict(e, ts=e["ts"] + 10 * i) for i in range(300) for e in _TRICKY_EVENTS]
    path = tmp_path / "tricky.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events, "traceName": "x"}, indent=1))
    with traces.TraceReader(path) as reader:
        batches = list(reader.event_batches())
    assert [e for batch in batches for e in batch] == events
    assert reader.metadata == {"schemaVersion": 1, "traceName": "x"}
    if chunk_chars > 1000:
        assert max(len(b) for b in batches) > 100  # whole runs of events decoded at once


def test_a_bad_event_among_many_gives_the_error_of_one_at_a_time_reading(tmp_path, monkeypatch):
    good = '{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2}'
    path = tmp_path / "bad.json"
    path.write_text('{"traceEvents": [' + ",\n".join([good] * 500 + ['{"ph": oops}'] + [good] * 500) + "]}")
    messages = []
    for chunk_chars in (1 << 20, 7):  # batches, and single values only
        monkeypatch.setattr(traces, "READ_CHUNK_CHARS", chunk_chars)
        with pytest.raises(TraceError, match="invalid JSON") as info:
            traces.read_metadata(path)
        messages.append(str(info.value))
    assert messages[0] == messages[1]


def _truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _flip_middle(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes(b ^ 0xFF for b in data[middle : middle + 64]) + data[middle + 64 :]


@pytest.mark.parametrize(
    ("name", "make", "message"),
    [
        ("truncated.pt.trace.json.gz", lambda gz, plain: _truncate(gz), "truncated"),
        ("truncated.pt.trace.json", lambda gz, plain: _truncate(plain), "truncated"),
        ("corrupt.pt.trace.json.gz", lambda gz, plain: _flip_middle(gz), ""),
        ("notgzip.pt.trace.json.gz", lambda gz, plain: b"\x1f\x8b" + b"garbage" * 20, "gzip"),
        ("foreign.json", lambda gz, plain: b'{"name": "not a trace", "values": [1, 2]}', "no traceEvents"),
        ("array.json", lambda gz, plain: b"[1, 2, 3]", "not a JSON object"),
        ("text.json", lambda gz, plain: b"hello world", "not a JSON object"),
        ("empty.json", lambda gz, plain: b"", "empty"),
        ("events.json", lambda gz, plain: b'{"traceEvents": {"a": 1}}', "not a JSON array"),
        ("badevent.json", lambda gz, plain: b'{"traceEvents": [{"ph": "X"}, 3]}', "traceEvents[1]"),
        ("trailing.json", lambda gz, plain: b'{"traceEvents": []} {"x": 1}', "after the top-level"),
        (
            "badjson.json",
            lambda gz, plain: b'{"traceEvents": [{"ph": "X", oops}]}' + b" " * 100,
            "invalid JSON",
        ),
    ],
)
def test_bad_files_raise_trace_error_naming_the_file(real_trace, tmp_path, name, make, message):
    with open(real_trace, "rb") as fh:
        gz = fh.read()
    path = tmp_path / name
    path.write_bytes(make(gz, gzip.decompress(gz)))
    with pytest.raises(TraceError, match=re.escape(message) if message else None) as info:
        traces.read_metadata(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ValueError)
    with pytest.raises(TraceError):
        trace_analysis.load_trace(path)


def test_missing_file_raises_trace_error(tmp_path):
    with pytest.raises(TraceError, match="cannot open") as info:
        traces.TraceReader(tmp_path / "nope.pt.trace.json.gz")
    assert "nope.pt.trace.json.gz" in str(info.value)


# --------------------------------------------------------------------------------------------------------
# Rewrite
# --------------------------------------------------------------------------------------------------------


def test_rewrite_makes_torch_tb_profiler_count_dataloader_time(real_trace, tmp_path):
    from torch_tb_profiler.profiler.event_parser import ProfileRole

    dst = str(tmp_path / "host_rank0.1.pt.trace.json.gz")
    written = traces.rewrite_trace(real_trace, dst, global_rank=1, world_size=4)
    assert written == os.path.getsize(dst)

    before = plugin_profile(real_trace, tmp_path)
    after = plugin_profile(dst, tmp_path)
    assert before.avg_costs.costs[ProfileRole.DataLoader] == 0  # torch 2.x + plugin 0.4.3: the bug
    assert after.avg_costs.costs[ProfileRole.DataLoader] > 0
    assert after.distributed_info == {"rank": 1, "world_size": 4}
    assert after.steps_names == before.steps_names


def test_rewrite_keeps_every_event_and_changes_only_dataloader_categories(real_trace, tmp_path):
    dst = str(tmp_path / "out.pt.trace.json")  # plain output
    traces.rewrite_trace(real_trace, dst, global_rank=0, world_size=2, backend="nccl")
    with open(dst, "rb") as fh:
        assert fh.read(2) != traces.GZIP_MAGIC
    original, rewritten = load_json(real_trace), load_json(dst)
    old_events, new_events = original.pop("traceEvents"), rewritten.pop("traceEvents")
    assert len(new_events) == len(old_events)
    changed = 0
    for old, new in zip(old_events, new_events, strict=True):
        if old.get("name") == DATALOADER and old.get("cat") == "user_annotation":
            assert new == {**old, "cat": "cpu_op"}  # name, ts, dur, pid, tid, args unchanged
            assert list(new) == list(old)
            changed += 1
        else:
            assert new == old
    assert changed == 3  # one DataLoader span per active step
    assert rewritten.pop("distributedInfo") == {"rank": 0, "world_size": 2, "backend": "nccl"}
    assert rewritten == original
    assert [f for f in os.listdir(tmp_path) if f.endswith(".partial")] == []


def test_rewrite_in_place(real_trace, tmp_path):
    path = str(tmp_path / "host_rank0.5.pt.trace.json.gz")
    shutil.copy(real_trace, path)
    traces.rewrite_trace(path, path, global_rank=0, world_size=1)
    assert traces.read_metadata(path)["distributedInfo"] == {"rank": 0, "world_size": 1}
    assert sum(1 for _ in traces.iter_events(path)) == sum(1 for _ in traces.iter_events(real_trace))
    assert os.listdir(tmp_path) == ["host_rank0.5.pt.trace.json.gz"]


def test_rewrite_keeps_torch_distributed_info(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with torch.profiler.profile() as prof:
            tensor = torch.ones(4)
            dist.all_reduce(tensor)
    finally:
        dist.destroy_process_group()
    src, dst = str(tmp_path / "ddp.pt.trace.json"), str(tmp_path / "ddp_rank0.1.pt.trace.json.gz")
    prof.export_chrome_trace(src)
    torch_info = load_json(src)["distributedInfo"]
    assert torch_info["backend"] == "gloo" and "pg_config" in torch_info

    traces.rewrite_trace(src, dst, global_rank=0, world_size=1, backend="nccl")
    assert traces.read_metadata(dst)["distributedInfo"] == torch_info  # torch's backend wins over ours


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"global_rank": -1, "world_size": 1}, "global_rank"),
        ({"global_rank": 0, "world_size": 0}, "world_size"),
        ({"global_rank": 2, "world_size": 2}, "global_rank must be < world_size"),
        ({"global_rank": True, "world_size": 2}, "global_rank"),
        ({"global_rank": 0, "world_size": 1, "backend": ""}, "backend"),
    ],
)
def test_rewrite_rejects_bad_arguments(real_trace, tmp_path, kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        traces.rewrite_trace(real_trace, tmp_path / "x.pt.trace.json.gz", **kwargs)
    assert os.listdir(tmp_path) == []


def test_rewrite_of_a_corrupt_trace_leaves_nothing_behind(real_trace, tmp_path):
    src = tmp_path / "bad.pt.trace.json.gz"
    with open(real_trace, "rb") as fh:
        src.write_bytes(_truncate(fh.read()))
    with pytest.raises(TraceError, match="bad.pt.trace.json.gz"):
        traces.rewrite_trace(src, tmp_path / "out.pt.trace.json.gz", global_rank=0, world_size=1)
    assert os.listdir(tmp_path) == ["bad.pt.trace.json.gz"]
