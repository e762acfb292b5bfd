"""Analyses over trace events (``trace_analysis.py``), on real torch.profiler traces and hand-made events."""

from __future__ import annotations

import gc
import json

import pytest

from lightning_perf.traces.figures import analysis as trace_analysis
from lightning_perf.traces.read import reader as traces
from lightning_perf.traces.read.spans import gc_paused
from tests.helpers import DATALOADER, plugin_profile, profile_tiny_loop


@pytest.fixture(scope="module")
def real_trace(tmp_path_factory: pytest.TempPathFactory) -> str:
    (path,) = profile_tiny_loop(str(tmp_path_factory.mktemp("real")))
    return path


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
    assert trace_analysis.kernel_busy_pct(events) == pytest.approx(32.5)
    # window [0, 50]: busy [0, 5] + [10, 50] = 45 -> 90 %
    assert trace_analysis.kernel_busy_pct(events, window=(0, 50)) == pytest.approx(90.0)
    assert trace_analysis.kernel_busy_pct([e for e in events if e.get("cat") != "kernel"]) is None
    with pytest.raises(ValueError, match="window"):
        trace_analysis.kernel_busy_pct(events, window=(10, 10))


def test_step_breakdown_follows_the_plugin_on_a_real_trace(real_trace, tmp_path):
    rewritten = str(tmp_path / "host_rank0.9.pt.trace.json.gz")
    traces.rewrite_trace(real_trace, rewritten, global_rank=0, world_size=1)
    plugin = plugin_profile(rewritten, tmp_path)
    order = ["kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec", "other"]
    for path in (real_trace, rewritten):  # DataLoader spans count whatever their category
        breakdown = trace_analysis.step_breakdown(trace_analysis.load_trace(path).spans)
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
    breakdown = trace_analysis.step_breakdown(events)
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
    (step,) = trace_analysis.step_breakdown(events).steps
    assert step.categories["communication"] == 50  # the collective op [10,30] and its kernel [40,70]
    assert step.categories["kernel"] == 0 and step.categories["cpu_exec"] == 10
    assert step.categories["other"] == 40


def test_step_breakdown_without_profiler_steps_uses_the_host_span():
    (step,) = trace_analysis.step_breakdown(
        [X("aten::mm", "cpu_op", 10, 30), X("aten::add", "cpu_op", 50, 10)]
    ).steps
    assert (step.step, step.start, step.end) == (None, 10, 60)
    assert step.categories["cpu_exec"] == 40 and step.categories["other"] == 10
    assert trace_analysis.step_breakdown([]).steps == []


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
    stats = {s.name: s for s in trace_analysis.cpu_operator_stats(events)}
    assert "ProfilerStep#1" not in stats and "forward" not in stats
    # linear: (100 - 20 - 10) + 30 + 50 = 150 self, 180 total, 3 calls
    assert (stats["aten::linear"].calls, stats["aten::linear"].self_us, stats["aten::linear"].total_us) == (
        3,
        150,
        180,
    )
    assert stats["aten::t"].self_us == 12 and stats["aten::as_strided"].self_us == 8
    assert [s.name for s in trace_analysis.cpu_operator_stats(events)][0] == "aten::linear"


def test_analyses_on_a_real_trace(real_trace):
    parsed = trace_analysis.load_trace(real_trace)
    assert [s.step for s in trace_analysis.step_spans(parsed.spans)] == [2, 3, 4]
    names = [s.name for s in trace_analysis.cpu_operator_stats(parsed.spans)]
    assert "aten::addmm" in names and DATALOADER in names
    assert trace_analysis.kernel_busy_pct(parsed.spans) is None  # CPU-only run
    assert trace_analysis.kernel_stats(parsed.spans) == []
    assert parsed.rank is None  # torch writes no distributedInfo outside torch.distributed


# events that leave load_trace's inline path for span_of: odd types, bounds, names and categories
_ODD_EVENTS = [
    {"ph": "X", "cat": "Kernel", "name": "k", "ts": 5, "dur": 2, "args": {"correlation": 7}},
    {"ph": "X", "cat": "cpu_op", "name": None, "ts": 1.5, "dur": 0.25, "args": {"external id": 3}},
    {"ph": "X", "cat": 3, "name": "op", "ts": 2, "dur": 1, "args": [1]},
    {"ph": "X", "name": "no cat", "ts": 2.5},
    {"ph": "X", "cat": "cpu_op", "name": "big", "ts": 2e300, "dur": 1e300},
    {"ph": "X", "cat": "cpu_op", "name": "bool", "ts": True, "dur": 1},
    {"ph": "X", "cat": "cpu_op", "name": "negative", "ts": 1, "dur": -1},
    {"ph": "X", "cat": "cpu_op", "name": "text", "ts": "1", "dur": 1},
    {"ph": "X", "cat": "cpu_op", "name": "overflow", "ts": 1.7e308, "dur": 1.7e308},
    {"ph": "i", "cat": "cpu_op", "name": "instant", "ts": 1},
    {"ph": "X", "cat": "python_function", "name": "f", "ts": 1, "dur": 1},
]


def test_load_trace_keeps_what_span_of_keeps(tmp_path):
    # the inline path of load_trace and span_of give the same spans and skip the same events
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"traceEvents": _ODD_EVENTS * 3}))
    expected, skipped = [], 0
    for event in _ODD_EVENTS * 3:
        if event.get("cat") == "python_function":
            continue
        try:
            span = trace_analysis.span_of(event)
        except ValueError:
            skipped += 1
            continue
        if span is not None:
            expected.append(span)
    parsed = trace_analysis.load_trace(path)
    assert parsed.spans == expected
    assert [type(value) for span in parsed.spans for value in span] == [
        type(value) for span in expected for value in span
    ]
    assert parsed.skipped_events == skipped == 3 * 4  # bool, negative, text, overflow
    assert parsed.event_count == 3 * len(_ODD_EVENTS)


def test_gc_paused_restores_the_collector():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause holds
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # left as the caller set it
    finally:
        gc.enable()
