"""The figures of small hand-made GPU traces, in both Kineto dialects and with ROCm names."""

from __future__ import annotations

import dataclasses
import gzip
import json

import pytest

from lightning_perf.traces.figures.gpu_figures import (
    is_tensor_core_eligible,
    trace_figures,
    uses_tensor_cores,
)
from lightning_perf.traces.figures.gpu_timeline import busy_pct
from lightning_perf.traces.read.loader import load_trace

# category names of the two dialects: torch 1.9 and torch >= 1.10
OLD = {"op": "Operator", "kernel": "Kernel", "runtime": "Runtime", "memcpy": "Memcpy", "step": "Operator"}
NEW = {
    "op": "cpu_op",
    "kernel": "kernel",
    "runtime": "cuda_runtime",
    "memcpy": "gpu_memcpy",
    "step": "user_annotation",
}


def x(name, cat, ts, dur, pid=1, tid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def step_events(
    c: dict, n: int, base: float, launch: str = "cudaLaunchKernel", sync: str = "cudaStreamSynchronize"
):
    """Step n of 1000 us: a conv (200 us sgemm kernel without tensor cores), an NCCL all-reduce of 300 us of
    which 100 us overlap the conv, a pageable HtoD copy, and .item() blocking 150 us in a sync."""
    corr = 10 * n
    return [
        x(f"ProfilerStep#{n}", c["step"], base, 1000),
        x("aten::to", c["op"], base + 10, 60),
        x("aten::copy_", c["op"], base + 12, 55),
        x("cudaMemcpyAsync", c["runtime"], base + 15, 50, correlation=corr + 1),
        x("Memcpy HtoD (Pageable -> Device)", c["memcpy"], base + 20, 40, pid=0, tid=7, correlation=corr + 1),
        x("aten::cudnn_convolution", c["op"], base + 100, 20),
        x(launch, c["runtime"], base + 105, 10, correlation=corr + 2),
        x("volta_sgemm_128x64_nn", c["kernel"], base + 110, 200, pid=0, tid=7, correlation=corr + 2),
        x("nccl:all_reduce", c["op"], base + 130, 10),
        x(launch, c["runtime"], base + 132, 5, correlation=corr + 3),
        x(
            "ncclKernel_AllReduce_RING_LL_Sum_float",
            c["kernel"],
            base + 210,
            300,
            pid=0,
            tid=20,
            correlation=corr + 3,
        ),
        x("aten::item", c["op"], base + 600, 160),
        x("aten::_local_scalar_dense", c["op"], base + 601, 158),
        x(sync, c["runtime"], base + 605, 150, correlation=corr + 4),
    ]


def write(tmp_path, events, name="t.json.gz", **meta):
    doc = {"schemaVersion": 1, "deviceProperties": [{"name": "V100", "computeMajor": 7, "computeMinor": 0,
           "totalGlobalMem": 16 * 10**9}], **meta, "traceEvents": events}  # fmt: skip
    path = tmp_path / name
    with gzip.open(path, "wt") as fh:
        json.dump(doc, fh)
    return load_trace(path)


@pytest.mark.parametrize("dialect", [OLD, NEW], ids=["torch1.9", "torch2"])
def test_figures_in_both_dialects(tmp_path, dialect):
    events = [e for n in range(3) for e in step_events(dialect, n, 1000.0 * n)]
    fig = trace_figures(write(tmp_path, events))
    assert fig.steps == 3 and fig.step_ms == pytest.approx(1.0)
    # steps 0 and 1 (HTA leaves the last out): copy [20,60], conv [110,310], NCCL [210,510] a step
    window = 1510 - 20
    assert fig.idle_pct == pytest.approx(100 * (window - 2 * 440) / window)  # 40 + 400 busy a step
    assert fig.compute_pct == pytest.approx(100 * 400 / window)
    assert fig.non_compute_pct == pytest.approx(100 * (2 * 440 - 400) / window)
    assert fig.kernels_per_step == 2 and fig.kernel_median_us == pytest.approx(250)
    assert fig.communication_ms_per_step == pytest.approx(0.3)
    assert fig.exposed_communication_ms_per_step == pytest.approx(0.2)
    assert fig.kernel_busy_pct == pytest.approx(100 * 3 * 400 / 3000)
    assert fig.compute_busy_pct == pytest.approx(100 * 3 * 200 / 3000)
    by_call = {b.name: b for b in fig.blocking}
    assert by_call["cudaStreamSynchronize"].operator == "aten::item > aten::_local_scalar_dense"
    assert by_call["cudaStreamSynchronize"].ms_per_step == pytest.approx(0.15)
    assert (
        by_call["cudaMemcpyAsync"].operator == "aten::to > aten::copy_"
    )  # pageable: blocks whatever its length
    assert fig.pageable_htod_calls == 3 and fig.pageable_htod_ms_per_step == pytest.approx(0.04)
    assert [m.kind for m in fig.memcpy] == ["HtoD (Pageable -> Device)"]
    # the conv kernel is all the compute kernel time: eligible, no tensor cores
    assert fig.tc_eligible_without_tc_pct == pytest.approx(100) and fig.tensor_core_pct == 0
    assert fig.compute_capability == [7, 0] and fig.memory_capacity_gb == pytest.approx(16)


def test_rocm_names(tmp_path):
    events = [
        e
        for n in range(2)
        for e in step_events(NEW, n, 1000.0 * n, launch="hipLaunchKernel", sync="hipStreamSynchronize")
    ]
    fig = trace_figures(write(tmp_path, events))
    assert fig.launches_per_step == 2
    assert "hipStreamSynchronize" in {b.name for b in fig.blocking}


def test_memory_growth_from_allocator_totals(tmp_path):
    events = [x(f"ProfilerStep#{n}", "user_annotation", 1000.0 * n, 1000) for n in range(4)]
    for n in range(4):  # 10 MB more at every step end, freed nothing
        total = (100 + 10 * n) * 1e6
        events.append({"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1000 * n + 900,
                       "args": {"Device Type": 1, "Device Id": 0, "Total Allocated": total, "Bytes": 1}})  # fmt: skip
    events.append(x("k", "kernel", 10, 5, pid=0, tid=7))
    parsed = write(tmp_path, events)
    assert parsed.memory_has_totals and len(parsed.memory) == 4
    fig = trace_figures(parsed)
    assert fig.memory_growth_mb_per_step == pytest.approx(10) and fig.memory_growth_steps == 3
    assert fig.memory_peak_gb == pytest.approx(0.13) and fig.memory_absolute  # GB are 1e9 bytes


def test_one_recorded_step_with_memory_events_gets_its_peak_and_says_why_no_growth(tmp_path):
    from lightning_perf.traces.report.figures import figure_lines

    events = [x("ProfilerStep#1", "user_annotation", 0, 1000), x("k", "kernel", 10, 5, pid=0, tid=7)]
    events.append({"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 900,
                   "args": {"Device Type": 1, "Device Id": 0, "Total Allocated": 2e9, "Bytes": 1}})  # fmt: skip
    fig = trace_figures(write(tmp_path, events))
    assert fig.memory_peak_gb == pytest.approx(2.0) and fig.memory_growth_mb_per_step is None
    text = "\n".join(figure_lines({"figures": dataclasses.asdict(fig)}))
    assert "GPU memory: peak 2.0 GB, growth not measured: it needs two recorded steps or more" in text


def test_cpu_only_trace_has_host_figures_only(tmp_path):
    events = [x("ProfilerStep#1", "user_annotation", 0, 100), x("aten::mm", "cpu_op", 10, 50)]
    fig = trace_figures(write(tmp_path, events))
    assert fig.steps == 1 and fig.idle_pct is None and fig.blocking == []


def test_name_rules():
    assert uses_tensor_cores("volta_h884gemm_64x64_nn") and uses_tensor_cores("sm90_xmma_gemm_bf16")
    assert uses_tensor_cores("nvjet_hsh_128x256") and not uses_tensor_cores("volta_sgemm_128x64_nn")
    for op in ("aten::cudnn_convolution", "aten::convolution_backward", "aten::addmm", "aten::mm", "MmBackward0",
               "autograd::engine::evaluate_function: AddmmBackward0", "aten::_scaled_dot_product_flash_attention"):  # fmt: skip
        assert is_tensor_core_eligible(op), op
    for op in ("aten::add_", "aten::comm_reduce", "aten::immediate", None):
        assert not is_tensor_core_eligible(op), op


def test_busy_pct_checks_its_window():
    with pytest.raises(ValueError, match="window"):
        busy_pct([], (5.0, 5.0))
