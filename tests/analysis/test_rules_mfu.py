"""The low_mfu finding's causes, each from the figure that shows it (issue 44): the FLOPs per counted operator
against the measured peak, the trace's non-matmul operators, the dtype against the datasheet's faster ones; and
the datasheet table's look-up by the names NVML and torch give."""

from __future__ import annotations

import pytest

from lightning_perf.analysis.compute.datasheet_peaks import lookup
from lightning_perf.analysis.compute.limit import DevicePeak, ModuleFlops, StepFlops, compute_limit, mfu_line
from lightning_perf.analysis.diagnosis import diagnose
from lightning_perf.analysis.trace_figures import TopOperator, TraceFigures
from tests.analysis.test_diagnosis import by_id, make

CPU_PEAK = DevicePeak(
    device="cpu", device_name="a CPU", dtype="fp32", measured_flops_per_s=100e9, measured_size=1024
)


def with_limit(summary, flops, calls, step_ms, peak=CPU_PEAK):
    step = StepFlops(
        flops=flops,
        operator_calls={"aten.mm": calls},
        modules=[ModuleFlops("encoder", flops, leaf=False), ModuleFlops("encoder.0", flops * 0.9)],
    )
    summary.compute_limit = compute_limit(step, peak, step_ms)
    return summary


def test_a_step_of_tiny_matmuls_is_launch_bound_and_names_the_modules():
    # 40 matmuls of 10 kFLOP: 0.1 us each at 100 GFLOP/s, in a 2 ms step
    summary = with_limit(make(1.0, step_ms=2.0), flops=4e5, calls=40, step_ms=2.0)
    finding = by_id(diagnose(summary), "low_mfu")
    assert finding.severity == "medium"
    assert "Launch/framework overhead: the step's 40 counted operators average 10 kFLOP" in finding.evidence
    assert "The FLOPs sit in encoder.0 (90%)." in finding.evidence
    assert "larger batch" in finding.recommendation


def test_matmuls_well_below_the_peaks_size_are_small_matmuls():
    # 10 matmuls of 2 x 256^3 FLOPs (34 MFLOP: 335 us at the peak), the peak measured at 1024
    flops = 10 * 2 * 256**3
    summary = with_limit(make(1.0, step_ms=10.0), flops=flops, calls=10, step_ms=10.0)
    finding = by_id(diagnose(summary), "low_mfu")
    assert finding.severity == "low"  # 33.6% MFU
    assert "Small matmuls: the step's 10 counted operators average 33.6 MFLOP, the size of a 256-square" in (
        finding.evidence
    )


def test_non_matmul_operators_of_the_trace_are_memory_bound():
    # a run in bf16 already: the advice is the fusion alone
    summary = with_limit(
        make(1.0, step_ms=10.0, precision="bf16-mixed"), flops=2e9 * 2, calls=2, step_ms=200.0
    )
    summary.trace_figures = [
        TraceFigures(
            step_ms=200.0,
            top_operators=[
                TopOperator("aten::mm", 2, 40.0),
                TopOperator("aten::native_layer_norm", 4, 90.0),
                TopOperator("aten::gelu", 4, 50.0),
            ],
        )
    ]
    finding = by_id(diagnose(summary), "low_mfu")
    assert "Memory-bound operators: aten::native_layer_norm, aten::gelu" in finding.evidence
    assert "70% of it" in finding.evidence
    assert finding.recommendation == (
        "Fuse operators with `torch.compile` (the elementwise and normalization ones above first)."
    )


def test_fp32_on_a_gpu_with_faster_dtypes_names_precision():
    sheet, fp32 = lookup("NVIDIA H100 80GB HBM3", "fp32")
    peak = DevicePeak(
        device="cuda:0",
        device_name="NVIDIA H100 80GB HBM3",
        dtype="fp32",
        measured_flops_per_s=50e12,
        measured_size=8192,
        datasheet_flops_per_s=fp32,
        datasheet_device=sheet.name,
    )
    summary = with_limit(
        make(1.0, step_ms=10.0, accelerator="cuda"), flops=1e11, calls=4, step_ms=10.0, peak=peak
    )
    finding = by_id(diagnose(summary), "low_mfu")
    assert (
        "Precision: fp32 matmuls on a H100 SXM, whose datasheet gives bf16 15x the fp32 rate"
        in finding.evidence
    )
    assert "bf16-mixed" in finding.recommendation
    line = mfu_line(summary.compute_limit)
    assert line.endswith(
        "20% of NVIDIA H100 80GB HBM3's measured 50 TFLOP/s fp32 matmul, 15% of the H100 SXM "
        "datasheet's 67 TFLOP/s"
    )


@pytest.mark.parametrize("wait_pct", [6.0, 40.0])
def test_silent_for_an_input_bound_run_and_above_the_line(wait_pct):
    assert by_id(diagnose(with_limit(make(wait_pct, step_ms=2.0), 4e5, 40, 2.0)), "low_mfu") is None
    # 2 x 8 GFLOP in 200 ms at a 100 GFLOP/s peak: 80%
    assert by_id(diagnose(with_limit(make(1.0, step_ms=200.0), 1.6e10, 2, 200.0)), "low_mfu") is None


@pytest.mark.parametrize(
    ("name", "dtype", "sheet", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", "H100 SXM", 989.5),
        ("NVIDIA H100 PCIe", "bf16", "H100 PCIe", 756.5),
        ("NVIDIA H100 NVL", "tf32", "H100 NVL", 417.5),
        ("NVIDIA H200", "fp16", "H200 SXM", 989.5),
        ("NVIDIA A100-SXM4-80GB", "tf32", "A100", 156.0),
        ("NVIDIA A10", "bf16", "A10", 125.0),
        ("NVIDIA L4", "fp32", "L4", 30.3),
        ("NVIDIA L40S", "bf16", "L40S", 362.05),
        ("Tesla V100-PCIE-16GB", "fp16", "V100 PCIe", 112.0),
        ("Tesla V100-SXM2-32GB", "fp16", "V100 SXM2", 125.0),
        ("Tesla T4", "fp16", "T4", 65.0),
        ("NVIDIA GeForce RTX 4090", "bf16", "GeForce RTX 4090", 165.2),
    ],
)
def test_the_datasheet_of_each_gpu_by_its_reported_name(name, dtype, sheet, tflops):
    found, flops = lookup(name, dtype)
    assert (found.name, flops) == (sheet, tflops * 1e12) and found.source.startswith("https://")


def test_no_datasheet_figure_for_an_unknown_device_or_dtype():
    assert lookup("NVIDIA A10G", "bf16") is None  # no NVIDIA datasheet for AWS's A10G
    assert lookup("Tesla T4", "bf16") is None  # Turing has no bf16
    assert lookup(None, "fp32") is None


@pytest.mark.parametrize(
    ("settings", "compiled", "change"),
    [
        # a CPU conv model in fp32: bf16 autocast (a CPU has it), torch.compile, channels_last
        (
            {"precision": "32-true", "model_has_conv": True},
            False,
            {"precision": "bf16-mixed", "compile": True, "channels_last": True},
        ),
        # an Ampere GPU in fp32 matmuls: TF32 too
        (
            {"accelerator": "cuda", "compute_capability": [8, 0], "float32_matmul_precision": "highest"},
            False,
            {"precision": "bf16-mixed", "matmul_precision": "high", "compile": True},
        ),
        # a V100 has no bf16 (the mixed_precision finding proposes 16-mixed); a compiled conv model in bf16 already
        ({"accelerator": "cuda", "compute_capability": [7, 0]}, False, {"compile": True}),
        ({"precision": "bf16-mixed", "model_has_conv": True}, True, {"channels_last": True}),
    ],
)
def test_low_mfu_carries_the_compute_settings_tune_measures(settings, compiled, change):
    from lightning_perf.analysis.compile_summary import CompileSummary

    summary = with_limit(make(1.0, step_ms=2.0, **settings), flops=4e5, calls=40, step_ms=2.0)
    summary.compile = CompileSummary(compiles=1, total_s=1.0) if compiled else None
    assert by_id(diagnose(summary), "low_mfu").settings_change == change
