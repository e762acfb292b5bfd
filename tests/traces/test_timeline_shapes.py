"""Trace shapes the GPU timeline and the step breakdown once got wrong (issue 34, points 4 and 5): GPU work that no
runtime call launched, a trace with no CPU events, and a step that starts while the previous one's kernels still
run. Small hand-made traces, figures worked out by hand."""

from __future__ import annotations

import json

import pytest

from lightning_perf.traces.figures.breakdown import step_breakdown
from lightning_perf.traces.figures.gpu_figures import trace_figures
from lightning_perf.traces.figures.gpu_timeline import gpu_timeline
from lightning_perf.traces.read.columns import host_steps
from lightning_perf.traces.read.loader import load_trace

DATALOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def x(name, cat, ts, dur, pid=1, tid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def gpu(name, cat, ts, dur, **args):
    return x(name, cat, ts, dur, pid=0, tid=7, **args)


def load(tmp_path, events):
    path = tmp_path / "t_rank0.1.pt.trace.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return load_trace(path)


def orphan_steps(orphan_ids):
    """Three steps of 100 us; steps 1 and 2 each launch a kernel and run one GPU activity no call launched
    (``orphan_ids``: its correlation id, or None); the last step (left out, as HTA) has one of each too."""
    first, second, third = ({} if i is None else {"correlation": i} for i in orphan_ids)
    return [
        x("ProfilerStep#1", "user_annotation", 0, 100),
        x("cudaLaunchKernel", "cuda_runtime", 10, 5, correlation=1),
        gpu("sgemm", "kernel", 20, 20, correlation=1),  # [20, 40]
        gpu("triton_poi_fused_0", "kernel", 50, 20, **first),  # [50, 70], no call
        x("ProfilerStep#2", "user_annotation", 100, 100),
        x("cudaLaunchKernel", "cuda_runtime", 110, 5, correlation=2),
        gpu("sgemm", "kernel", 120, 20, correlation=2),  # [120, 140]
        gpu("Memcpy DtoD (Device -> Device)", "gpu_memcpy", 150, 10, **second),  # [150, 160], no call
        x("ProfilerStep#3", "user_annotation", 200, 100),
        x("cudaLaunchKernel", "cuda_runtime", 210, 5, correlation=3),
        gpu("sgemm", "kernel", 220, 20, correlation=3),
        gpu("triton_poi_fused_0", "kernel", 250, 10, **third),  # the last step's: left out
    ]


@pytest.mark.parametrize(
    "orphan_ids",
    [(None, None, None), (77, 78, 79), ("a", "b", "c")],
    ids=["no-correlation-id", "id-without-a-call", "string-ids"],
)
def test_gpu_work_without_a_launching_call_is_in_the_timeline(tmp_path, orphan_ids):
    """HTA joins GPU work to its runtime call and drops what has none (968 of 3,653 activities of an
    activation-checkpointing trace): their time was counted idle. They ran: window [20, 160], busy 70 us."""
    events = orphan_steps(orphan_ids)
    spans = load(tmp_path, events).spans
    for trace in (spans, events):  # the typed reader's columns, and dicts (ids of any JSON type)
        timeline = gpu_timeline(trace, host_steps(trace))
        assert timeline.steps_counted == 2
        assert timeline.window_us == 140
        assert timeline.idle_us == 70  # [40,50] [70,120] [140,150]
        assert timeline.compute_us == 60 and timeline.memcpy_us == 10
        assert timeline.idle_pct == pytest.approx(50.0)
        assert timeline.compute_pct == pytest.approx(100 * 60 / 140)
        assert timeline.non_compute_pct == pytest.approx(100 * 10 / 140)


def test_gpu_work_launched_before_the_first_step_stays_out(tmp_path):
    """Work still running from before profiling began has ids below every call of the steps (the ids count the
    process's runtime calls): as the work of calls made before the first step, it is not the steps' work."""
    events = [
        gpu("leftover", "kernel", 5, 30, correlation=1),  # [5, 35], launched before ProfilerStep#1
        x("ProfilerStep#1", "user_annotation", 0, 100),
        x("cudaLaunchKernel", "cuda_runtime", 10, 5, correlation=10),
        gpu("sgemm", "kernel", 40, 20, correlation=10),  # [40, 60]
        x("ProfilerStep#2", "user_annotation", 100, 100),
        x("cudaLaunchKernel", "cuda_runtime", 110, 5, correlation=11),
        gpu("sgemm", "kernel", 120, 20, correlation=11),  # [120, 140]
        x("ProfilerStep#3", "user_annotation", 200, 100),
    ]
    timeline = gpu_timeline(events, host_steps(events))
    assert (timeline.window_us, timeline.idle_us, timeline.compute_us) == (100, 60, 40)


def test_gpu_only_trace_gets_a_timeline_and_one_step_of_unknown_number(tmp_path):
    """No CPU event at all (a device-side capture): the whole trace is one step whose number is unknown, and the
    GPU timeline is over all of its GPU work."""
    events = [
        gpu("sgemm", "kernel", 0, 30, correlation=1),  # [0, 30]
        gpu("sgemm", "kernel", 40, 30, correlation=2),  # [40, 70]
        gpu("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", 80, 10, correlation=3),  # [80, 90]
        gpu("ncclDevKernel_AllReduce_Sum_f32", "kernel", 95, 5, correlation=4),  # [95, 100]
    ]
    parsed = load(tmp_path, events)
    (step,) = step_breakdown(parsed.spans).steps
    assert (step.step, step.start, step.end) == (None, 0, 100)
    assert step.categories == {
        "dataloader": 0, "cpu_exec": 0, "kernel": 60, "memcpy": 10, "memset": 0,
        "communication": 5, "runtime": 0, "other": 25,
    }  # fmt: skip
    figures = trace_figures(parsed)
    assert figures.idle_pct == pytest.approx(25.0)
    assert figures.compute_pct == pytest.approx(60.0)
    assert figures.non_compute_pct == pytest.approx(15.0)
    assert figures.kernel_busy_pct == pytest.approx(65.0)


def overlapping_steps():
    """Three steps of 100 us, each: a DataLoader call, an operator and the kernel it launches. Step 1's kernel
    runs until 130: past the start of step 2's host span (100) and all of step 2's DataLoader call [102, 120]."""
    events = []
    for n, (base, kernel_start, kernel_dur) in enumerate([(0, 50, 80), (100, 150, 30), (200, 250, 30)], 1):
        events += [
            x(f"ProfilerStep#{n}", "user_annotation", base, 100),
            x(DATALOADER, "user_annotation", base + 2, 18),
            x("aten::mm", "cpu_op", base + 30, 30),
            x("cudaLaunchKernel", "cuda_runtime", base + 40, 5, correlation=n),
            gpu("sgemm", "kernel", kernel_start, kernel_dur, correlation=n),
        ]
    return events


def test_overlapping_steps_keep_their_dataloader_time():
    """With "launch" alignment a step starts at its host start however long the previous step's kernels run,
    and counts its own spans only: step 2 keeps its 18 us DataLoader call, step 1 its 80 us kernel."""
    breakdown = step_breakdown(overlapping_steps(), alignment="launch")
    assert breakdown.device_aligned and breakdown.overlapping
    first, second, third = breakdown.steps
    assert (first.start, first.end) == (0, 130)
    assert (second.start, second.end) == (100, 200)  # not moved to 130
    assert (third.start, third.end) == (200, 300)
    # step 1: kernel [50,130]; runtime [40,45]; DataLoader [2,20]; CPU exec [30,40]+[45,50]; other 12
    assert first.categories == {
        "dataloader": 18, "cpu_exec": 15, "kernel": 80, "memcpy": 0, "memset": 0,
        "communication": 0, "runtime": 5, "other": 12,
    }  # fmt: skip
    # step 2: its DataLoader [102,120] although step 1's kernel runs then; [120,130] is nothing of step 2's
    assert second.categories == {
        "dataloader": 18, "cpu_exec": 15, "kernel": 30, "memcpy": 0, "memset": 0,
        "communication": 0, "runtime": 5, "other": 32,
    }  # fmt: skip
    assert second.categories == third.categories


def test_torch_tb_profiler_alignment_counts_the_overlapped_dataloader_call_as_kernel():
    """The default (the plugin's, equal to its Overview on tests/data/realtraces): the steps partition the time, so
    step 2 starts when step 1's kernel ends and its DataLoader call, under that kernel, is Kernel of step 1."""
    breakdown = step_breakdown(overlapping_steps())
    assert not breakdown.overlapping
    first, second, _ = breakdown.steps
    assert (first.end, second.start) == (130, 130)
    assert second.categories["dataloader"] == 0 and first.categories["kernel"] == 80


def test_launch_alignment_equals_the_plugins_when_steps_do_not_overlap():
    events = [e for e in overlapping_steps() if not (e["name"] == "sgemm" and e["ts"] == 50)]
    events.append(gpu("sgemm", "kernel", 50, 40, correlation=1))  # step 1's kernel ends at 90: no overlap
    launch, plugin = step_breakdown(events, alignment="launch"), step_breakdown(events)
    assert [(s.start, s.end, s.categories) for s in launch.steps] == [
        (s.start, s.end, s.categories) for s in plugin.steps
    ]
    with pytest.raises(ValueError, match="alignment"):
        step_breakdown(events, alignment="hta")


def test_a_gpu_only_trace_is_said_to_have_no_known_steps(tmp_path, capsys):
    from lightning_perf.cli import main

    events = [gpu("sgemm", "kernel", 0, 30, correlation=1), gpu("sgemm", "kernel", 40, 30, correlation=2)]
    (tmp_path / "device_rank0.1.pt.trace.json").write_text(json.dumps({"traceEvents": events}))
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "steps unknown" in out and "of the trace (no ProfilerStep spans)" in out
    assert "of the profiled steps" not in out
