"""The trace rules on hand-made figures, at and around each threshold."""

from __future__ import annotations

import pytest

from lightning_perf.analysis.rules import trace_thresholds as t
from lightning_perf.analysis.rules.thresholds import INPUT_BOUND_HIGH_PCT, INPUT_BOUND_MODERATE_PCT
from lightning_perf.analysis.rules.trace import (
    diagnose_trace,
    exposed_communication,
    gpu_idle,
    host_sync,
    input_bound,
    launch_bound,
    memory_growth,
    mixed_precision,
    pageable_memcpy,
)
from lightning_perf.analysis.summary import Settings
from lightning_perf.analysis.trace_figures import BlockingCall, TraceFigures

EPS = 0.01


def figures(**fields) -> TraceFigures:
    base = dict(steps=5, step_ms=100.0, dataloader_pct=0.0)
    return TraceFigures(**{**base, **fields})


def severity(rule, **fields) -> str | None:
    finding = rule(figures(**fields))
    return None if finding is None else finding.severity


def test_input_bound_grades_like_the_summary_rule_and_is_silent_below_moderate():
    assert severity(input_bound, dataloader_pct=INPUT_BOUND_HIGH_PCT) == "high"
    assert severity(input_bound, dataloader_pct=INPUT_BOUND_HIGH_PCT - EPS) == "medium"
    assert severity(input_bound, dataloader_pct=INPUT_BOUND_MODERATE_PCT) == "medium"
    assert severity(input_bound, dataloader_pct=INPUT_BOUND_MODERATE_PCT - EPS) is None
    assert severity(input_bound, dataloader_pct=None) is None


def test_gpu_idle_lines_and_silence_when_input_bound():
    where = {"CPU operators": 60.0, "blocking call": 30.0, "other": 10.0}
    assert severity(gpu_idle, step_idle_pct=t.GPU_IDLE_HIGH_PCT, host_during_idle_pct=where) == "high"
    assert severity(gpu_idle, step_idle_pct=t.GPU_IDLE_HIGH_PCT - EPS) == "medium"
    assert severity(gpu_idle, step_idle_pct=t.GPU_IDLE_MEDIUM_PCT) == "medium"
    assert severity(gpu_idle, step_idle_pct=t.GPU_IDLE_MEDIUM_PCT - EPS) is None
    assert severity(gpu_idle, step_idle_pct=80.0, dataloader_pct=INPUT_BOUND_MODERATE_PCT) is None
    finding = gpu_idle(figures(step_idle_pct=60.0, host_during_idle_pct=where))
    assert "CPU operators 60.0%, blocking call 30.0%" in finding.evidence


def test_host_sync_names_the_call_and_operator_and_needs_an_idle_gpu_to_be_costly():
    def sync(ms: float, idle: float = 20.0):
        call = BlockingCall("cudaStreamSynchronize", "aten::item > aten::_local_scalar_dense", 5, ms)
        return host_sync(figures(blocking=[call], blocking_ms_per_step=ms, step_idle_pct=idle))

    assert sync(t.HOST_SYNC_HIGH_PCT).severity == "high"  # step is 100 ms: ms == pct
    assert sync(t.HOST_SYNC_HIGH_PCT - EPS).severity == "medium"
    assert sync(t.HOST_SYNC_MEDIUM_PCT).severity == "medium"
    assert sync(t.HOST_SYNC_MEDIUM_PCT - EPS) is None
    assert sync(30.0, idle=t.HOST_SYNC_MIN_IDLE_PCT - EPS).severity == "low"
    finding = sync(30.0)
    assert "cudaStreamSynchronize" in finding.title and "aten::item" in finding.evidence
    assert ".item()" in finding.recommendation and "non_blocking=True" in finding.recommendation


def test_launch_bound_needs_launches_over_kernels_tiny_kernels_and_idle():
    ok = dict(
        launch_ms_per_step=30.0,
        kernel_ms_per_step=20.0,
        small_kernel_count_pct=t.LAUNCH_BOUND_SMALL_KERNEL_PCT,
        step_idle_pct=t.GPU_IDLE_MEDIUM_PCT,
        launches_per_step=3000.0,
        kernel_median_us=4.0,
    )
    assert severity(launch_bound, **ok) == "medium"
    assert "torch.compile" in launch_bound(figures(**ok)).recommendation
    assert severity(launch_bound, **{**ok, "launch_ms_per_step": 20.0}) is None
    assert (
        severity(launch_bound, **{**ok, "small_kernel_count_pct": t.LAUNCH_BOUND_SMALL_KERNEL_PCT - EPS})
        is None
    )
    assert severity(launch_bound, **{**ok, "step_idle_pct": t.GPU_IDLE_MEDIUM_PCT - EPS}) is None
    assert severity(launch_bound, **{**ok, "kernel_ms_per_step": None}) is None


def test_pageable_memcpy_any_copy_is_low_a_visible_share_is_medium():
    line = t.PAGEABLE_MEMCPY_MEDIUM_PCT  # ms on a 100 ms step
    assert severity(pageable_memcpy, pageable_htod_calls=3, pageable_htod_ms_per_step=line) == "medium"
    assert severity(pageable_memcpy, pageable_htod_calls=3, pageable_htod_ms_per_step=line - EPS) == "low"
    assert severity(pageable_memcpy, pageable_htod_calls=0) is None
    assert pageable_memcpy(figures(pageable_htod_calls=1)).settings_change == {"pin_memory": True}


def test_mixed_precision_lines_and_target_by_compute_capability():
    volta, ampere = [7, 0], [8, 0]
    share = t.MIXED_PRECISION_MEDIUM_PCT
    assert severity(mixed_precision, tc_eligible_without_tc_pct=share, compute_capability=volta) == "medium"
    assert (
        severity(mixed_precision, tc_eligible_without_tc_pct=share - EPS, compute_capability=volta) == "low"
    )
    assert severity(mixed_precision, tc_eligible_without_tc_pct=t.MIXED_PRECISION_LOW_PCT - EPS) is None
    pascal = mixed_precision(figures(tc_eligible_without_tc_pct=90.0, compute_capability=[6, 1]))
    assert pascal.severity == "info" and pascal.settings_change == {} and "has none" in pascal.title
    assert mixed_precision(
        figures(tc_eligible_without_tc_pct=90.0, compute_capability=volta)
    ).settings_change == {"precision": "16-mixed"}
    bf16 = mixed_precision(figures(tc_eligible_without_tc_pct=90.0, compute_capability=ampere))
    assert bf16.settings_change == {"precision": "bf16-mixed"}
    assert 'set_float32_matmul_precision("high")' in bf16.recommendation


MI300X = dict(device_name="AMD Instinct MI300X", compute_capability=[9, 4])
A100 = dict(device_name="NVIDIA A100-SXM4-80GB", compute_capability=[8, 0])
V100 = dict(device_name="Tesla V100-SXM2-16GB", compute_capability=[7, 0])


def by_dtype(gpu: dict, settings: Settings | None = None, **eligible: list[float]):
    """The mixed-precision finding of eligible time ``matmul_bf16=[pct, named pct]`` (kind_dtype) on ``gpu``."""
    split = {key.replace("_", "/"): value for key, value in eligible.items()}
    return mixed_precision(figures(tc_eligible_by=split, tensor_core_pct=0.0, **gpu), settings)


def test_mixed_precision_half_precision_work_is_matrix_core_work_whatever_its_kernels():
    """Issue 47: bf16 work on an MI300X gets no precision advice, whatever its kernels are called."""
    assert by_dtype(MI300X, matmul_bf16=[60.0, 0.0], conv_bf16=[30.0, 10.0]) is None
    assert by_dtype(A100, matmul_fp16=[90.0, 0.0]) is None
    # bf16 on a V100: no bf16 tensor cores there; fp16 has them
    volta = by_dtype(V100, matmul_bf16=[60.0, 0.0])
    assert volta.settings_change == {"precision": "16-mixed"} and "not bf16" in volta.recommendation
    assert "compute in bf16 (the operators' input types)" in volta.evidence


def test_mixed_precision_fp32_by_tf32_then_kernel_names():
    off = Settings(precision="32-true", float32_matmul_precision="highest", cudnn_allow_tf32=False)
    on = Settings(precision="32-true", float32_matmul_precision="high", cudnn_allow_tf32=True)
    # named fp32 MFMA kernels: without TF32 they are not the matrix-core work precision changes would give
    finding = by_dtype(MI300X, off, matmul_fp32=[55.0, 55.0], matmul_bf16=[20.0, 0.0])
    assert finding.severity == "medium" and finding.settings_change == {"precision": "bf16-mixed"}
    assert "the 55.0% of kernel time in that work would run on tensor cores" in finding.recommendation
    assert "TF32 off (float32_matmul_precision='highest')" in finding.evidence
    assert by_dtype(MI300X, on, matmul_fp32=[55.0, 0.0], conv_fp32=[20.0, 0.0]) is None
    assert by_dtype(A100, off, conv_fp32=[30.0, 0.0]).severity == "low"
    # no summary: whether TF32 was on is not known, the kernel names decide
    assert by_dtype(A100, None, matmul_fp32=[55.0, 55.0]) is None
    names = by_dtype(A100, None, matmul_fp32=[45.0, 5.0])
    assert "by their kernel names" in names.evidence and names.severity == "low"
    # a V100 has no TF32: fp32 is without tensor cores whatever the settings, fp16 the way on
    volta = by_dtype(V100, None, conv_fp32=[70.0, 10.0])
    assert "has no TF32" in volta.evidence and volta.settings_change == {"precision": "16-mixed"}


def test_mixed_precision_of_a_trace_without_input_types_follows_the_runs_precision():
    unknown = dict(matmul_unknown=[70.0, 0.0])
    assert by_dtype(A100, Settings(precision="bf16-mixed"), **unknown) is None
    assert by_dtype(A100, Settings(precision="16-mixed"), **unknown) is None
    fp32 = by_dtype(A100, Settings(precision="32-true", float32_matmul_precision="highest"), **unknown)
    assert "precision=32-true in the run summary" in fp32.evidence and fp32.severity == "medium"
    assert "by their kernel names" in by_dtype(A100, Settings(), **unknown).evidence
    # diagnose_trace passes the settings to the rule
    split = figures(tc_eligible_by={"matmul/unknown": [70.0, 0.0]}, **A100)
    assert [f.id for f in diagnose_trace(split)] == ["mixed_precision"]
    assert diagnose_trace(split, settings=Settings(precision="bf16-mixed")) == []


def test_exposed_communication_lines():
    def comm(exposed: float):
        return exposed_communication(
            figures(communication_ms_per_step=40.0, exposed_communication_ms_per_step=exposed)
        )

    assert comm(t.EXPOSED_COMM_HIGH_PCT).severity == "high"
    assert comm(t.EXPOSED_COMM_HIGH_PCT - EPS).severity == "medium"
    assert comm(t.EXPOSED_COMM_MEDIUM_PCT).severity == "medium"
    assert comm(t.EXPOSED_COMM_MEDIUM_PCT - EPS) is None
    assert "gradient_as_bucket_view=True" in comm(30.0).recommendation


def test_memory_growth_leak_headroom_and_room():
    base = dict(memory_capacity_gb=16.0, memory_absolute=True, steps=5)
    leak = memory_growth(
        figures(**base, memory_growth_mb_per_step=t.MEMORY_GROWTH_MIN_MB_PER_STEP, memory_growth_steps=4,
                memory_peak_gb=4.0)
    )  # fmt: skip
    assert leak.severity == "high" and "loss.detach()" in leak.recommendation
    assert "full in ~12000 steps" in leak.evidence  # (16 - 4) GB * 1000 MB / 1 MB a step
    flat = dict(memory_growth_mb_per_step=t.MEMORY_GROWTH_MIN_MB_PER_STEP - EPS, memory_growth_steps=4)
    near = memory_growth(figures(**base, **flat, memory_peak_gb=16.0 * t.MEMORY_NEAR_CAPACITY_PCT / 100))
    assert near.severity == "medium" and "headroom" in near.recommendation.lower()
    room = memory_growth(figures(**base, **flat, memory_peak_gb=16.0 * t.MEMORY_ROOM_PCT / 100 - EPS))
    assert room.severity == "info" and "larger batch" in room.recommendation
    assert memory_growth(figures(**base, **flat, memory_peak_gb=12.0)) is None  # between the lines
    # growth in too few steps is noise, not a leak
    assert (
        memory_growth(
            figures(**base, memory_growth_mb_per_step=5.0, memory_growth_steps=2, memory_peak_gb=12.0)
        )
        is None
    )


def test_diagnose_trace_sorts_by_severity_and_checks_its_input():
    found = diagnose_trace(
        figures(dataloader_pct=30.0, tc_eligible_without_tc_pct=60.0, compute_capability=[7, 0],
                pageable_htod_calls=2, pageable_htod_ms_per_step=0.5)
    )  # fmt: skip
    assert [f.id for f in found] == ["input_bound", "mixed_precision", "pageable_memcpy"]
    assert diagnose_trace(TraceFigures()) == []
    with pytest.raises(ValueError, match="figures"):
        diagnose_trace({"steps": 1})
