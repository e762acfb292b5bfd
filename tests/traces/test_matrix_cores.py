"""Matrix cores read from what the operators computed (issue 47): MI300X bf16 training whose kernels no name table
lists (MIOpen's helpers and composable_kernel's ck_tile convolutions, a Triton attention kernel under
scaled_dot_product_attention, Inductor's Triton templates) gets no precision advice; fp32 GEMMs get it without TF32
and not with it, whatever their kernel names; a trace without input types is read with the run's precision
setting; the evidence says whether the input types, the run's settings or the kernel names decided."""

from __future__ import annotations

import json

import pytest

from lightning_perf import cli
from lightning_perf.analysis.diagnosis import diagnose
from lightning_perf.analysis.summary import SUMMARY_FILENAME, RunSummary, Settings
from lightning_perf.output.trace_findings import with_trace_findings
from lightning_perf.traces.figures.gpu_figures import trace_figures
from lightning_perf.traces.read.loader import load_trace
from lightning_perf.traces.report.build import build_report

MI300X = {"name": "AMD Instinct MI300X", "computeMajor": 9, "computeMinor": 4, "totalGlobalMem": 192 * 10**9}
A100 = {"name": "NVIDIA A100-SXM4-80GB", "computeMajor": 8, "computeMinor": 0, "totalGlobalMem": 80 * 10**9}
BF16 = ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "", "Scalar"]
FP32 = ["float", "float", "float", "Scalar", "Scalar"]
# MIOpen's implicit-GEMM convolutions on gfx942 and the helpers its NHWC solvers launch beside them
IGEMM_FWD = "igemm_fwd_gtcx3_nhwc_bf16_bx0_ex1_bt256x128x32_wt32x32x8_ws1x1_wr2x2_ta1x8x4x1_1x4x1x64"
IGEMM_BWD = "igemm_bwd_gtcx3_nhwc_bf16_bx0_ex0_bt128x128x32_wt32x32x8_ws1x1_wr2x2_ta1x4x1x1_1x8x1x32"
TRANSPOSE = "batched_transpose_32x16_half"
# composable_kernel's tile API: the weight gradient of a grouped convolution ("Mfma" in its warp GEMM's name)
CK_TILE_WRW = (
    "ck_tile::kentry<256, 1, ck_tile::GroupedConvolutionBackwardWeightKernel<ck_tile::GemmPipelineAgBgCrCompV3<"
    "ck_tile::WarpGemmMfmaBf16Bf16F32M32N32K16>>>"
)
ATTN_FWD, ATTN_BWD = "attn_fwd", "bwd_kernel_dk_dv"
# hipBLASLt fp32 GEMMs: with MatrixInstruction (fp32 MFMA) and without (vector ALU)
CIJK_FP32_MFMA = "Cijk_Ailk_Bljk_SB_MT128x128x16_MI32x32x2x1_SN_1LDSB0_AFC1_ISA942"
CIJK_FP32_VALU = "Cijk_Ailk_Bljk_SB_MT64x64x8_SN_K1"


def x(name, cat, ts, dur, pid=1, tid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def launches(ops, kernels, ts, corr, types=None, call="hipExtModuleLaunchKernel"):
    """Operators nested outermost first (the innermost with ``types`` as ``Input type``), and inside them one
    launch per (kernel, duration): the events and the time after them."""
    events, end = [], ts + 10 + 50 * len(kernels)
    for depth, op in enumerate(ops):
        args = {"Input type": types} if types is not None and depth == len(ops) - 1 else {}
        events.append(x(op, "cpu_op", ts + depth, end - ts - 2 * depth, **args))
    t = ts + 5
    for n, (kernel, dur) in enumerate(kernels):
        events += [
            x(call, "cuda_runtime", t, 10, correlation=corr + n),
            x(kernel, "kernel", t + 15, dur, pid=0, tid=7, correlation=corr + n),
        ]
        t += 50
    return events, end + 10


def steps(step_kernels, n_steps=3):
    """``n_steps`` steps of 5000 us, each with the (ops, kernels, types, call) groups of ``step_kernels``."""
    events = []
    for n in range(n_steps):
        base = 5000 * n
        events.append(x(f"ProfilerStep#{n}", "user_annotation", base, 5000))
        t = base + 10
        for i, (ops, kernels, types, call) in enumerate(step_kernels):
            group, t = launches(ops, kernels, t, 1000 * n + 100 * i + 1, types, call)
            events += group
    return events


def write(folder, events, device=MI300X, summary: Settings | None = None):
    folder.mkdir(exist_ok=True)
    doc = {"schemaVersion": 1, "deviceProperties": [device], "traceEvents": events}
    (folder / "rank0.1.pt.trace.json").write_text(json.dumps(doc))
    if summary is not None:
        RunSummary(run_name="r", settings=summary).save(folder / SUMMARY_FILENAME)
    return folder / "rank0.1.pt.trace.json"


def report_of(folder):
    (trace,) = build_report(str(folder), jobs=1)["traces"]
    return trace, {f["id"]: f for f in trace["findings"]}


CONV = "aten::miopen_convolution"
BWD = "aten::convolution_backward"
CONVOLUTIONS = [
    (["aten::conv2d", "aten::convolution", CONV], [(TRANSPOSE, 60), (IGEMM_FWD, 200), (TRANSPOSE, 60)], BF16,
     "hipExtModuleLaunchKernel"),
    (["autograd::engine::evaluate_function: ConvolutionBackward0", "ConvolutionBackward0", BWD],
     [(IGEMM_BWD, 200), (CK_TILE_WRW, 150)], BF16, "hipModuleLaunchKernel"),
]  # fmt: skip
ATTENTION = [
    (["aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention"], [(ATTN_FWD, 300)],
     BF16[:3], "hipModuleLaunchKernel"),
    (["aten::_scaled_dot_product_flash_attention_backward"], [(ATTN_BWD, 500)], BF16[:3],
     "hipModuleLaunchKernel"),
    (["CompiledFunction", "triton_tem_fused_mm_0"], [("triton_tem_fused_mm_0", 200)], BF16[:3],
     "hipModuleLaunchKernel"),
]  # fmt: skip


@pytest.mark.parametrize("shape", [CONVOLUTIONS, ATTENTION], ids=["igemm-convolutions", "triton-attention"])
def test_bf16_work_gets_no_precision_advice_whatever_its_kernels_are_called(tmp_path, capsys, shape):
    """A bf16 run on an MI300X: every eligible kernel is matrix-core work by its operator's input types, the
    transposes MIOpen runs around an NHWC convolution, ck_tile's and Triton's kernels included."""
    fig = trace_figures(load_trace(write(tmp_path, steps(shape))))
    assert fig.tc_eligible_pct == pytest.approx(100.0)
    assert fig.tc_eligible_without_tc_pct == pytest.approx(0.0)
    assert fig.tensor_core_pct == pytest.approx(100.0)
    assert fig.tc_decided_by == "input types"
    assert set(fig.tc_eligible_by) <= {"conv/bf16", "matmul/bf16"}
    trace, findings = report_of(tmp_path)
    assert "mixed_precision" not in findings
    assert trace["figures"]["tc_decided_by"] == "input types"
    assert cli.main(["report", str(tmp_path)]) == 0
    assert "of which without tensor cores 0.0% (decided by input types)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("matmul_precision", "kernel", "advised"),
    [("highest", CIJK_FP32_MFMA, True), ("high", CIJK_FP32_VALU, False)],
    ids=["no-tf32-mfma-named", "tf32-valu-named"],
)
def test_fp32_gemms_are_advised_by_their_types_and_tf32_not_by_their_names(
    tmp_path, matmul_precision, kernel, advised
):
    """fp32 GEMMs (hipBLASLt ``Cijk_*``) and a bf16 attention beside them: without TF32 the fp32 work gets the
    advice, its share named, whatever MFMA instructions its kernels use; with TF32 on, no advice, whatever the
    names. The run's TF32 setting comes from the summary beside the trace."""
    mm = (["aten::linear", "aten::addmm"], [(kernel, 400)], FP32, "hipExtModuleLaunchKernel")
    other = (["aten::add_"], [("elementwise_kernel", 200)], ["float", "float", "Scalar"], "hipLaunchKernel")
    events = steps([mm, other, ATTENTION[0]])
    settings = Settings(
        precision="32-true", float32_matmul_precision=matmul_precision, matmul_allow_tf32=None
    )
    write(tmp_path, events, summary=settings)
    trace, findings = report_of(tmp_path)
    fig = trace["figures"]
    assert ("mixed_precision" in findings) is advised
    if advised:  # a step: 400 us fp32 GEMM, 200 us elementwise, 300 us bf16 attention (not advised)
        finding = findings["mixed_precision"]
        assert finding["settings_change"] == {"precision": "bf16-mixed"}
        assert "44.4% of kernel time" in finding["recommendation"]  # the eligible fp32 share would move
        assert "fp32" in finding["evidence"] and "input types" in finding["evidence"]
        assert "TF32 off" in finding["evidence"]
        assert fig["tc_eligible_without_tc_pct"] == pytest.approx(44.44, abs=0.01)
    else:
        assert fig["tc_eligible_without_tc_pct"] == pytest.approx(0.0)
        assert fig["tensor_core_pct"] == pytest.approx(100 * 700 / 900, abs=0.01)
    assert fig["tc_eligible_by"]["matmul/fp32"][0] == pytest.approx(100 * 400 / 900, abs=0.01)
    assert fig["tc_eligible_by"]["matmul/bf16"][0] == pytest.approx(100 * 300 / 900, abs=0.01)


def test_fp32_without_a_summary_falls_back_to_kernel_names(tmp_path):
    """Whether TF32 was on is not in a trace: without the run summary the kernel names decide fp32 work, and the
    evidence says so."""
    mm = (["aten::mm"], [(CIJK_FP32_VALU, 400)], FP32, "hipExtModuleLaunchKernel")
    write(tmp_path, steps([mm]), device=A100)
    trace, findings = report_of(tmp_path)
    evidence = findings["mixed_precision"]["evidence"]
    assert "by their kernel names" in evidence and "compute in fp32" in evidence
    assert trace["figures"]["tc_decided_by"] == "kernel names"


@pytest.mark.parametrize(
    ("precision", "matmul_precision", "advised"),
    [
        ("bf16-mixed", "highest", False),
        ("32-true", "highest", True),
        ("32-true", "high", False),
        (None, None, True),
    ],
    ids=str,
)
def test_a_trace_without_input_types_is_read_with_the_runs_precision(
    tmp_path, precision, matmul_precision, advised
):
    """No record_shapes: the eligible operators compute in the run's precision (the summary's), fp32 on matrix
    cores only with TF32 on (float32_matmul_precision "high"); without a summary the kernel names decide (a
    Triton attention kernel's name says nothing: counted without)."""
    events = steps([(ops, kernels, None, call) for ops, kernels, _, call in ATTENTION[:2]])
    summary = (
        None
        if precision is None
        else Settings(precision=precision, float32_matmul_precision=matmul_precision)
    )
    write(tmp_path, events, summary=summary)
    trace, findings = report_of(tmp_path)
    assert ("mixed_precision" in findings) is advised
    if precision == "32-true" and advised:
        assert "precision=32-true in the run summary" in findings["mixed_precision"]["evidence"]
        assert "TF32 off" in findings["mixed_precision"]["evidence"]
    if precision is None:
        assert "by their kernel names" in findings["mixed_precision"]["evidence"]
    decided = {"bf16-mixed": "the run's precision setting", "32-true": "the run's precision setting"}
    assert trace["figures"]["tc_decided_by"] == decided.get(precision, "kernel names")


def test_input_types_that_are_not_strings_never_break_the_reader(tmp_path):
    """A malformed ``Input type`` (numbers, an object) is no types, whichever reader reads it: names decide."""
    events = steps([(["aten::mm"], [(CIJK_FP32_VALU, 400)], None, "hipExtModuleLaunchKernel")])
    for event in events:
        if event["name"] == "aten::mm":
            event["args"]["Input type"] = [1, {"a": 2}]
    fig = trace_figures(load_trace(write(tmp_path, events)))
    assert fig.tc_eligible_by == {"matmul/unknown": [pytest.approx(100.0), 0.0]}
    assert fig.tc_decided_by == "kernel names"


def test_the_dict_reader_keeps_the_same_input_types(tmp_path):
    """An event the typed decoding cannot hold (args that are not an object) sends its batch to the dict reader:
    the input types read there decide the same."""
    events = steps(CONVOLUTIONS + ATTENTION)
    typed = trace_figures(load_trace(write(tmp_path / "typed", events)))
    odd = [{"ph": "i", "name": "marker", "cat": "user_annotation", "ts": 1, "pid": 1, "tid": 1, "args": [1]}]
    dicts = trace_figures(load_trace(write(tmp_path / "dicts", odd + events)))
    assert dicts.tc_eligible_by == typed.tc_eligible_by and set(typed.tc_eligible_by) == {
        "conv/bf16",
        "matmul/bf16",
    }
    assert (dicts.tc_eligible_without_tc_pct, dicts.tc_decided_by) == (0.0, "input types")


def test_a_bf16_run_under_full_precision_settings_gets_no_precision_advice(tmp_path):
    """precision="32-true" with the model autocast by hand: the summary's settings alone advise bf16-mixed, the
    traces' input types show the work already in bf16, and the merged findings drop that advice. fp32 work
    under the same settings keeps it, with the trace's share."""
    settings = Settings(
        precision="32-true", accelerator="cuda", compute_capability=[9, 4], float32_matmul_precision="highest"
    )
    mm = (["aten::linear", "aten::addmm"], [(CIJK_FP32_VALU, 400)], FP32, "hipExtModuleLaunchKernel")
    for name, shape, advised in (("bf16", CONVOLUTIONS + ATTENTION, False), ("fp32", [mm], True)):
        summary = RunSummary(run_name="r", settings=settings)
        summary.findings = diagnose(summary)
        assert "mixed_precision" in {f.id for f in summary.findings}  # the settings alone
        summary.trace_figures = [trace_figures(load_trace(write(tmp_path / name, steps(shape))))]
        merged = {f.id: f for f in with_trace_findings(summary)}
        assert ("mixed_precision" in merged) is advised, name
        if advised:
            assert "the 100.0% of kernel time" in merged["mixed_precision"].recommendation


@pytest.mark.parametrize(
    "device",
    [
        {"name": "AMD Radeon RX 6800 XT", "computeMajor": 10, "computeMinor": 3},
        {"name": "AMD Instinct MI50", "computeMajor": 9, "computeMinor": 0},
    ],
    ids=["rdna2", "vega-mi50"],
)
@pytest.mark.parametrize("types", [FP32, BF16], ids=["fp32", "bf16"])
def test_an_amd_gpu_without_matrix_cores_is_told_so_not_advised(tmp_path, device, types):
    """RDNA2 (compute capability 10.x) and Vega (MI50: the 9.0 of CDNA's MI100 and MI200, told by name) have
    no matrix cores: no precision setting moves the work onto them, whatever it computes in."""
    conv = (["aten::convolution", CONV], [(IGEMM_FWD, 400)], types, "hipExtModuleLaunchKernel")
    write(tmp_path, steps([conv]), device=device)
    trace, findings = report_of(tmp_path)
    finding = findings["mixed_precision"]
    assert finding["severity"] == "info" and finding["settings_change"] == {}
    assert "the GPU has none" in finding["title"] and "CDNA" in finding["recommendation"]
    assert trace["figures"]["tc_eligible_without_tc_pct"] == pytest.approx(100.0)


def test_report_leaves_out_a_summarys_settings_based_advice_the_traces_types_contradict(tmp_path):
    """A summary written by a fit (or an older version) advising bf16-mixed from its settings alone, beside bf16
    traces: `report` lists the summary's findings without that advice; beside fp32 traces it keeps it."""
    settings = Settings(precision="32-true", accelerator="cuda", compute_capability=[9, 4])
    mm = (["aten::linear", "aten::addmm"], [(CIJK_FP32_VALU, 400)], FP32, "hipExtModuleLaunchKernel")
    for name, shape, kept in (("bf16", CONVOLUTIONS + ATTENTION, False), ("fp32", [mm], True)):
        write(tmp_path / name, steps(shape))
        summary = RunSummary(run_name="r", settings=settings)
        summary.findings = diagnose(summary)
        summary.save(tmp_path / name / SUMMARY_FILENAME)
        report = build_report(str(tmp_path / name), jobs=1)
        assert ("mixed_precision" in {f["id"] for f in report["findings"]}) is kept, name
