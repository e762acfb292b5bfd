"""The vendor tables (traces/vendors.py) and what they change on small hand-made traces of AMD (ROCm/HIP) and
MTIA runs: MFMA kernels are matrix-core kernels, HIP launches and blocking HIP calls are counted, RCCL's
kernels are communication, MTIA's device events are device work."""

from __future__ import annotations

import argparse
import json

import pytest

from lightning_perf.cli import report as report_command
from lightning_perf.traces.figures.gpu_figures import is_tensor_core_eligible, trace_figures
from lightning_perf.traces.read.loader import load_trace
from lightning_perf.traces.read.spans import KERNEL_CATS, RUNTIME_CATS
from lightning_perf.traces.vendors import (
    ASYNC_COPY_CALLS,
    SYNC_CALLS,
    is_communication_kernel_name,
    is_launch_call,
    is_matrix_core_kernel,
    is_sync_call,
)

MI300X = {"name": "AMD Instinct MI300X", "computeMajor": 9, "computeMinor": 4, "totalGlobalMem": 192 * 10**9}
# bf16 GEMMs and convolutions of an MI300X run, as rocBLAS/hipBLASLt (Tensile), composable_kernel and MIOpen
# name them
TENSILE_BF16 = (
    "Cijk_Alik_Bljk_BBS_BH_MT128x128x64_MI16x16x1_SN_LDSB1_AFC1_AFEM1_ASEM1_CLR1_ISA942_IU1_K1_WG32_8_1"
)
CK_BF16 = (
    "void ck::kernel_gemm_xdl_cshuffle_v3<ck::GridwiseGemm_xdl_cshuffle_v3<ck::tensor_layout::gemm::RowMajor>"
)
MIOPEN_BF16 = (
    "igemm_fwd_gtcx3_nhwc_bf16_bx0_ex1_bt256x64x8_wt64x16x4_ws1x1_wr2x2_ta1x1x8x1_1x8x1x32_tb1x1x2x1"
)
MSCCL = "mscclKernel_Sum_hip_bfloat16_Simple_false"


def x(name, cat, ts, dur, pid=1, tid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def launched(op, call, kernel, ts, dur, corr, runtime_cat="cuda_runtime", kernel_cat="kernel"):
    """An operator on the host thread, the runtime call inside it, and the kernel it started on the GPU."""
    return [
        x(op, "cpu_op", ts, 30),
        x(call, runtime_cat, ts + 5, 10, correlation=corr),
        x(kernel, kernel_cat, ts + 20, dur, pid=0, tid=7, correlation=corr),
    ]


def write(tmp_path, events, name="rank0.1.pt.trace.json", device=MI300X):
    path = tmp_path / name
    doc = {
        "schemaVersion": 1,
        "distributedInfo": {"rank": 0},
        "deviceProperties": [device],
        "traceEvents": events,
    }
    path.write_text(json.dumps(doc))
    return path


def run_report(capsys, *argv: str) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    report_command.add_arguments(parser)
    code = report_command.run(parser.parse_args(list(argv)))
    return code, capsys.readouterr().out


def mfma_steps(n_steps: int = 3) -> list[dict]:
    events = []
    for n in range(n_steps):
        base, corr = 1000.0 * n, 10 * n
        events += [x(f"ProfilerStep#{n}", "user_annotation", base, 1000)]
        events += launched("aten::mm", "hipExtModuleLaunchKernel", TENSILE_BF16, base + 10, 200, corr + 1)
        events += launched("aten::miopen_convolution", "hipExtModuleLaunchKernel", MIOPEN_BF16, base + 300, 200,
                           corr + 2)  # fmt: skip
        events += launched("aten::addmm", "hipLaunchKernel", CK_BF16, base + 600, 100, corr + 3)
    return events


# ---------------------------------------------------------------------------------------------------------
# Traces
# ---------------------------------------------------------------------------------------------------------


def test_mfma_kernels_are_matrix_core_kernels_and_get_no_mixed_precision_advice(tmp_path, capsys):
    path = write(tmp_path, mfma_steps())
    fig = trace_figures(load_trace(path))
    assert fig.tensor_core_pct == pytest.approx(100.0)
    assert fig.tc_eligible_pct == pytest.approx(100.0)
    assert fig.tc_eligible_without_tc_pct == pytest.approx(0.0)
    code, out = run_report(capsys, str(tmp_path), "--format", "json")
    assert code == 0 and "mixed_precision" not in out and "bf16-mixed" not in out
    code, out = run_report(capsys, str(tmp_path))
    assert "without tensor cores 0.0%" in out and "Tensor cores: 100.0% of kernel time" in out


def test_hip_launches_are_counted_in_a_trace_without_profiler_steps(tmp_path):
    """An inference loop (vLLM-style: no ProfilerStep#) on ROCm: the launches of the whole trace count."""
    events = [
        *launched("aten::mm", "hipExtModuleLaunchKernel", TENSILE_BF16, 10, 200, 1),
        *launched("triton_poi_fused_add_0", "hipModuleLaunchKernel", "triton_poi_fused_add_0", 300, 20, 2),
        *launched("aten::add", "hipLaunchKernel", "elementwise_kernel", 400, 20, 3),
    ]
    fig = trace_figures(load_trace(write(tmp_path, events)))
    assert fig.steps == 1
    assert fig.launches_per_step == 3
    assert fig.launch_ms_per_step == pytest.approx(0.03)


def test_a_blocking_hipfree_is_a_blocking_call(tmp_path, capsys):
    """MI300X DDP: hipFree holds the host 3,346 ms of a 3,392 ms step (and .item()'s hipMemcpyWithStream)."""
    events = []
    for n in range(2):
        base, corr = 3_392_000.0 * n, 10 * n
        events += [x(f"ProfilerStep#{n}", "user_annotation", base, 3_392_000)]
        events += launched("aten::mm", "hipLaunchKernel", TENSILE_BF16, base + 10, 20_000, corr + 1)
        events += [
            x("aten::empty", "cpu_op", base + 30_000, 3_347_000),
            x("hipFree", "cuda_runtime", base + 30_100, 3_346_000, correlation=corr + 2),
            x("aten::item", "cpu_op", base + 3_380_000, 20),
            x("hipMemcpyWithStream", "cuda_runtime", base + 3_380_002, 10, correlation=corr + 3),
            x("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", base + 3_380_004, 2, pid=0, tid=7,
              correlation=corr + 3),
        ]  # fmt: skip
    path = write(tmp_path, events)
    fig = trace_figures(load_trace(path))
    by_name = {b.name: b for b in fig.blocking}
    assert by_name["hipFree"].operator == "aten::empty" and by_name["hipFree"].calls == 2  # one a step
    assert by_name["hipFree"].ms_per_step == pytest.approx(3346.0)
    assert by_name["hipMemcpyWithStream"].ms_per_step == pytest.approx(0.01)
    assert fig.blocking_ms_per_step == pytest.approx(3346.01)
    _, out = run_report(capsys, str(tmp_path))
    assert "Host-blocking calls: 3346.0 ms a step; largest hipFree from aten::empty" in out
    assert "Host-blocking calls: none" not in out and "Host-blocking calls: 0.0 ms" not in out


def test_rccl_kernels_are_communication_not_kernels_without_matrix_cores(tmp_path):
    """RCCL's MSCCL all-reduce kernel is a collective: out of the tensor-core shares, as NCCL's are."""
    events = mfma_steps(2)
    for n in range(2):
        events += launched("nccl:all_reduce", "hipLaunchKernel", MSCCL, 1000.0 * n + 750, 200, 10 * n + 4)
    fig = trace_figures(load_trace(write(tmp_path, events)))
    assert fig.tensor_core_pct == pytest.approx(100.0)
    assert fig.communication_ms_per_step is not None


def test_mtia_device_events_are_device_work(tmp_path, capsys):
    """An MTIA trace: host calls in mtia_runtime, device work in mtia_ccp_events (Kineto's MTIA categories)."""
    events = []
    for n in range(2):
        base = 1000.0 * n
        events += [x(f"ProfilerStep#{n}", "user_annotation", base, 1000)]
        events += launched("aten::mm", "runFunction", "mm_kernel", base + 10, 400, n + 1, runtime_cat="mtia_runtime",
                           kernel_cat="mtia_ccp_events")  # fmt: skip
    path = write(tmp_path, events, device={"name": "MTIA"})
    fig = trace_figures(load_trace(path))
    assert fig.kernels_per_step == 1 and fig.kernel_ms_per_step == pytest.approx(0.4)
    assert fig.kernel_busy_pct == pytest.approx(40.0)
    code, out = run_report(capsys, str(tmp_path), "--format", "json")
    (trace,) = json.loads(out)["traces"]
    assert code == 0 and trace["kernel_busy_pct"] == pytest.approx(40.0)
    assert trace["top_kernels"][0]["name"] == "mm_kernel"
    _, out = run_report(capsys, str(tmp_path))
    assert "no GPU kernels recorded" not in out


# ---------------------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        TENSILE_BF16,
        "Custom_Cijk_Alik_Bljk_BBS_BH_Bias_AS_SAV_UserArgs_MT64x16x64_MI16x16x1_SN",  # hipBLASLt
        "Cijk_Ailk_Bljk_HB_MT128x128x16_MI32x32x8x1_SN_1LDSB0",  # rocBLAS, older Tensile: four numbers
        CK_BF16,
        "_ZN2ck59kernel_gemm_xdl_cshuffle_v3_multi_d_blockscale_b_preshuffleINS_58GridwiseGemm",
        "kernel_gemm_xdlops_v2r3",
        MIOPEN_BF16,
        "igemm_bwd_gtcx_nchw_fp16_bx0_ex1_bt128x128x32_wt32x32x8",
        "igemm_fwd_gtcx35_nhwc_bf16_bx0_ex1_bt256x128x32",
        "gridwise_convolution_implicit_gemm_v4r4_xdlops_nchw_kcyx_nkhw",
        "igemm_fwd_nhwc_bf16_xdlops",
        "mfma_moe1_silu_mul_afp8_wfp4",
        # NVIDIA, unchanged
        "volta_h884gemm_64x64_nn",
        "sm90_xmma_gemm_bf16",
        "nvjet_hsh_128x256",
        "ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x3_tn",
    ],
)
def test_matrix_core_kernels(name):
    assert is_matrix_core_kernel(name)


@pytest.mark.parametrize(
    "name",
    [
        "Cijk_Ailk_Bljk_SB_MT64x64x8_SN_K1",  # Tensile without MatrixInstruction: vector ALU
        "Cijk_Alik_Bljk_S_B_MIAV0_MIWT1_15_SN",  # MI-parameters that are not an instruction shape
        "igemm_fwd_gtc_nchw_fp32_bx0_ex0_bt128x128x16_tt8x8",  # MIOpen dlops
        "igemm_fwd_gtcn2_nchwc_kcyxc_fp16x8_bx0_ex1_bt128x128x32",
        "MIOpenBatchNormFwdTrainSpatial",
        "void at::native::elementwise_kernel<128, 4>",
        "volta_sgemm_128x64_nn",
        "triton_poi_fused_add_0",
        MSCCL,
    ],
)
def test_not_matrix_core_kernels(name):
    assert not is_matrix_core_kernel(name)


def test_launch_calls_of_cuda_and_hip():
    for name in ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch",
                 "hipLaunchKernel", "hipExtModuleLaunchKernel", "hipModuleLaunchKernel", "hipExtLaunchKernel",
                 "hipLaunchCooperativeKernel", "hipGraphLaunch", "hipLaunchByPtr"):  # fmt: skip
        assert is_launch_call(name), name
    for name in (
        "hipMemcpyAsync",
        "hipLaunchHostFunc",
        "cudaStreamSynchronize",
        "hipFree",
        "cudaEventRecord",
    ):
        assert not is_launch_call(name), name


def test_blocking_calls_of_cuda_and_their_hip_twins():
    for name in ("hipFree", "hipMalloc", "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize",
                 "hipMemcpy", "hipMemcpyWithStream", "hipMemset", "hipHostFree", "cudaFree", "cudaMalloc",
                 "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaMemcpy", "cuCtxSynchronize"):  # fmt: skip
        assert is_sync_call(name), name
    for name in (
        "hipMemcpyAsync",
        "cudaMemcpyAsync",
        "hipLaunchKernel",
        "hipEventRecord",
        "hipStreamWaitEvent",
    ):
        assert not is_sync_call(name), name
    # every CUDA runtime call of the tables has its HIP twin
    for table in (SYNC_CALLS, ASYNC_COPY_CALLS):
        for name in (n for n in table if n.startswith("cuda")):
            assert "hip" + name.removeprefix("cuda") in table, name
    assert not SYNC_CALLS & ASYNC_COPY_CALLS


def test_communication_kernels():
    for name in (
        "ncclKernel_AllReduce_RING_LL_Sum_float",
        "ncclDevKernel_Generic_4",
        MSCCL,
        "rcclAllReduceKernel",
    ):
        assert is_communication_kernel_name(name), name
    for name in (TENSILE_BF16, "triton_poi_fused_add_0", "Memcpy DtoH"):
        assert not is_communication_kernel_name(name), name


def test_device_and_runtime_categories():
    assert {"kernel", "mtia_ccp_events"} <= KERNEL_CATS
    assert {"cuda_runtime", "cuda_driver", "runtime", "hip_runtime", "mtia_runtime"} <= RUNTIME_CATS
    assert not KERNEL_CATS & RUNTIME_CATS


def test_rocm_convolutions_are_tensor_core_eligible():
    for op in ("aten::miopen_convolution", "aten::miopen_depthwise_convolution", "aten::cudnn_convolution"):
        assert is_tensor_core_eligible(op), op
