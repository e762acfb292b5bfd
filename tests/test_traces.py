"""Trace reading, rewriting and analyses, on traces from real torch.profiler runs and hand-made events."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import tracemalloc

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_perf import traces
from lightning_perf.traces import TraceError

DATALOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def profile_tiny_training(out_dir: str, batches: int = 8) -> list[str]:
    """A few real training steps under torch.profiler (wait=1, warmup=1, active=3, one cycle): its trace."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(batches * 8, 16), torch.randint(0, 4, (batches * 8,))), 8)
    paths: list[str] = []

    def ready(prof: torch.profiler.profile) -> None:
        paths.append(os.path.join(out_dir, f"host_rank0.{prof.step_num}.pt.trace.json.gz"))
        prof.export_chrome_trace(paths[-1])

    schedule = torch.profiler.schedule(wait=1, warmup=1, active=3, repeat=1)
    with torch.profiler.profile(schedule=schedule, on_trace_ready=ready) as prof:
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            prof.step()
    return paths


@pytest.fixture(scope="module")
def real_trace(tmp_path_factory: pytest.TempPathFactory) -> str:
    (path,) = profile_tiny_training(str(tmp_path_factory.mktemp("real")))
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
        traces.load_trace(path)


def test_missing_file_raises_trace_error(tmp_path):
    with pytest.raises(TraceError, match="cannot open") as info:
        traces.TraceReader(tmp_path / "nope.pt.trace.json.gz")
    assert "nope.pt.trace.json.gz" in str(info.value)


# --------------------------------------------------------------------------------------------------------
# Rewrite
# --------------------------------------------------------------------------------------------------------


def _plugin_profile(path: str, tmp_path):
    from torch_tb_profiler.profiler.data import RunProfileData

    return RunProfileData.parse("worker", None, path, str(tmp_path))


def test_rewrite_makes_torch_tb_profiler_count_dataloader_time(real_trace, tmp_path):
    from torch_tb_profiler.profiler.event_parser import ProfileRole

    dst = str(tmp_path / "host_rank0.1.pt.trace.json.gz")
    written = traces.rewrite_trace(real_trace, dst, global_rank=1, world_size=4)
    assert written == os.path.getsize(dst)

    before = _plugin_profile(real_trace, tmp_path)
    after = _plugin_profile(dst, tmp_path)
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


# --------------------------------------------------------------------------------------------------------
# Analyses
# --------------------------------------------------------------------------------------------------------


def X(name: str, cat: str, ts: float, dur: float, tid: int = 1, pid: int = 1, **args) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def test_kernel_busy_pct_by_hand():
    events = [
        X("ProfilerStep#1", "user_annotation", 0, 100),
        X("ProfilerStep#2", "user_annotation", 100, 100),
        X("aten::mm", "cpu_op", 0, 200),  # not a kernel
        X("Memcpy HtoD", "gpu_memcpy", 60, 30, pid=0, tid=7),  # not a kernel either
        X("k1", "kernel", 10, 20, pid=0, tid=7),  # [10, 30]
        X("k2", "kernel", 20, 30, pid=0, tid=8),  # [20, 50]: overlaps k1 -> merged [10, 50] = 40
        X("k3", "kernel", 120, 10, pid=0, tid=7),  # [120, 130] = 10
        X("k4", "kernel", 190, 40, pid=0, tid=7),  # [190, 230] clipped to the window end 200 = 10
        X("k5", "kernel", -20, 25, pid=0, tid=7),  # [-20, 5] clipped to the window start 0 = 5
        {"ph": "i", "name": "[memory]", "ts": 50},
    ]
    # window [0, 200] (first step start .. last step end); busy 40 + 10 + 10 + 5 = 65 -> 32.5 %
    assert traces.kernel_busy_pct(events) == pytest.approx(32.5)
    # window [0, 50]: busy [0, 5] + [10, 50] = 45 -> 90 %
    assert traces.kernel_busy_pct(events, window=(0, 50)) == pytest.approx(90.0)
    assert traces.kernel_busy_pct([e for e in events if e.get("cat") != "kernel"]) is None
    with pytest.raises(ValueError, match="window"):
        traces.kernel_busy_pct(events, window=(10, 10))


def test_step_breakdown_follows_the_plugin_on_a_real_trace(real_trace, tmp_path):
    rewritten = str(tmp_path / "host_rank0.9.pt.trace.json.gz")
    traces.rewrite_trace(real_trace, rewritten, global_rank=0, world_size=1)
    plugin = _plugin_profile(rewritten, tmp_path)
    order = ["kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec", "other"]
    for path in (real_trace, rewritten):  # DataLoader spans count whatever their category
        breakdown = traces.step_breakdown(traces.load_trace(path).spans)
        assert [str(s.step) for s in breakdown.steps] == plugin.steps_names
        for ours, theirs in zip(breakdown.steps, plugin.steps_costs, strict=True):
            assert ours.categories["dataloader"] > 0
            assert sum(ours.categories.values()) == pytest.approx(ours.duration, rel=1e-9)
            assert ours.duration == pytest.approx(theirs.costs[-1], abs=1e-3)
            for role, cost in zip(order, theirs.costs, strict=False):
                assert ours.categories[role] == pytest.approx(cost, abs=1e-3), role


def test_step_breakdown_by_hand_with_gpu_events():
    events = [
        X("ProfilerStep#1", "user_annotation", 0, 100),
        X(DATALOADER, "user_annotation", 0, 30),
        X("aten::mm", "cpu_op", 40, 20),
        X("cudaLaunchKernel", "cuda_runtime", 45, 5, correlation=1),
        X("sgemm", "kernel", 55, 75, pid=0, tid=7, correlation=1),  # runs past the host step: until 130
        X("ProfilerStep#2", "user_annotation", 100, 100),
        X("aten::add", "cpu_op", 100, 10),
        X("cudaLaunchKernel", "cuda_runtime", 105, 1, correlation=2),
        X("cudaMemcpyAsync", "cuda_runtime", 107, 1, correlation=3),
        X("add_kernel", "kernel", 130, 20, pid=0, tid=7, correlation=2),
        X("Memcpy DtoH", "gpu_memcpy", 150, 10, pid=0, tid=7, correlation=3),
        X("ProfilerStep#2", "gpu_user_annotation", 130, 30, pid=0, tid=7),  # GPU mirror: not a step
    ]
    breakdown = traces.step_breakdown(events)
    assert breakdown.device_aligned and breakdown.dropped_tail_steps == 0
    first, second = breakdown.steps
    # step 1 ends with its kernel at 130; step 2 starts there and ends with the host at 200
    assert (first.step, first.start, first.end) == (1, 0, 130)
    assert (second.step, second.start, second.end) == (2, 130, 200)
    # step 1: kernel [55,130]=75; runtime [45,50]=5; DataLoader [0,30]=30; CPU exec [40,45]+[50,55]=10
    # (aten::add at [100,110] lies under the kernel); other [30,40]=10
    assert first.categories == {
        "dataloader": 30, "cpu_exec": 10, "kernel": 75, "memcpy": 0, "memset": 0,
        "communication": 0, "runtime": 5, "other": 10,
    }  # fmt: skip
    # step 2: kernel [130,150]=20, memcpy [150,160]=10, other 40
    assert second.categories["kernel"] == 20 and second.categories["memcpy"] == 10
    assert second.categories["other"] == 40 and second.categories["cpu_exec"] == 0
    assert breakdown.average()["total"] == pytest.approx(100)


def test_step_breakdown_counts_collectives_as_communication():
    events = [
        X("ProfilerStep#3", "user_annotation", 0, 100),
        X("nccl:all_reduce", "user_annotation", 10, 20, **{"External id": 9}),
        X("ncclDevKernel_AllReduce_Sum_f32", "kernel", 40, 30, pid=0, tid=7, **{"External id": 9}),
        X("aten::mul", "cpu_op", 80, 10),
    ]
    (step,) = traces.step_breakdown(events).steps
    assert step.categories["communication"] == 50  # the collective op [10,30] and its kernel [40,70]
    assert step.categories["kernel"] == 0 and step.categories["cpu_exec"] == 10
    assert step.categories["other"] == 40


def test_step_breakdown_without_profiler_steps_uses_the_host_span():
    (step,) = traces.step_breakdown([X("aten::mm", "cpu_op", 10, 30), X("aten::add", "cpu_op", 50, 10)]).steps
    assert (step.step, step.start, step.end) == (None, 10, 60)
    assert step.categories["cpu_exec"] == 40 and step.categories["other"] == 10
    assert traces.step_breakdown([]).steps == []


def test_cpu_operator_self_time_by_hand():
    events = [
        X("ProfilerStep#1", "user_annotation", 0, 200),
        X("aten::linear", "cpu_op", 0, 100),
        X("aten::t", "cpu_op", 10, 20),  # child of linear
        X("aten::as_strided", "cpu_op", 12, 8),  # child of t
        X("aten::addmm", "cpu_op", 40, 10),  # child of linear
        X("aten::linear", "cpu_op", 120, 30),
        X("aten::linear", "cpu_op", 0, 50, tid=2),  # another thread: not nested in the first linear
        X("forward", "python_function", 0, 200),  # python functions are not operators
    ]
    stats = {s.name: s for s in traces.cpu_operator_stats(events)}
    assert "ProfilerStep#1" not in stats and "forward" not in stats
    # linear: (100 - 20 - 10) + 30 + 50 = 150 self, 180 total, 3 calls
    assert (stats["aten::linear"].calls, stats["aten::linear"].self_us, stats["aten::linear"].total_us) == (
        3,
        150,
        180,
    )
    assert stats["aten::t"].self_us == 12 and stats["aten::as_strided"].self_us == 8
    assert [s.name for s in traces.cpu_operator_stats(events)][0] == "aten::linear"


def test_analyses_on_a_real_trace(real_trace):
    parsed = traces.load_trace(real_trace)
    assert [s.step for s in traces.step_spans(parsed.spans)] == [2, 3, 4]
    names = [s.name for s in traces.cpu_operator_stats(parsed.spans)]
    assert "aten::addmm" in names and DATALOADER in names
    assert traces.kernel_busy_pct(parsed.spans) is None  # CPU-only run
    assert traces.kernel_stats(parsed.spans) == []
    assert parsed.rank is None  # torch writes no distributedInfo outside torch.distributed
