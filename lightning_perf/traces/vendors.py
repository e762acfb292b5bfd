"""What the vendors call things, as data in one place: which trace categories are device work and which are host
runtime calls, which kernels run on matrix cores (NVIDIA tensor cores, AMD MFMA/XDLOPS), which runtime calls
launch GPU work or block the host (CUDA and HIP), and which kernels are collectives (NCCL, RCCL).

Each table cites where its names come from. The predicates are asked once per distinct name (the callers go
through ``SpanColumns.where_name``/``classify``, which ask once per distinct name or (category, name) pair, and
each predicate is cached besides): no regular expression runs per event.

Standard library only; imports nothing else of the package (``traces.read.spans`` imports it).
"""

from __future__ import annotations

import functools
import re

# ---------------------------------------------------------------------------------------------------------
# Trace categories (lower-cased, as torch-tb-profiler lower-cases `cat` before looking it up)
# ---------------------------------------------------------------------------------------------------------

# Device work that is a kernel. "kernel" is Kineto's CONCURRENT_KERNEL on every backend (CUPTI, roctracer,
# XPU). MTIA: Kineto's ActivityType MTIA_CCP_EVENTS ("MTIA ondevice CCP events"), written as category
# "mtia_ccp_events" (pytorch/kineto libkineto/include/ActivityType.h and libkineto/src/ActivityType.cpp);
# HolisticTraceAnalysis counts that category as GPU kernels too (hta/common/types.py: KERNEL_CATEGORY_PATTERN
# "(kernel)|(gpu_mem.+)|(mtia_ccp_events)"). Newer Kineto makes MTIA_CCP_EVENTS an alias of CONCURRENT_KERNEL,
# so newer MTIA traces write "kernel". (HTA reads MTIA events named "dma..." as memory; here they count as
# kernels: device work either way.)
DEVICE_KERNEL_CATS = frozenset({"kernel", "mtia_ccp_events"})
# Host-side runtime and driver calls. "runtime": torch 1.9 / torch-tb-profiler 0.4.3; "cuda_runtime",
# "cuda_driver": torch 2.x (ROCm builds write HIP calls as cuda_runtime as well); "hip_runtime": seen in
# ROCm-side tools' traces; "mtia_runtime" ("host side MTIA runtime events") and "xpu_runtime" ("host side
# xpu runtime events"): Kineto's ActivityType.h / ActivityType.cpp, and HTA's DEVICE_RUNTIME_CATEGORY_PATTERN
# "(cuda_runtime)|(mtia_runtime)".
RUNTIME_CATS = frozenset(
    {"runtime", "cuda_runtime", "cuda_driver", "hip_runtime", "mtia_runtime", "xpu_runtime"}
)

# ---------------------------------------------------------------------------------------------------------
# (a) Matrix-core kernels, by name
# ---------------------------------------------------------------------------------------------------------

# NVIDIA tensor cores: torch-tb-profiler's TC_Allowlist (tb_plugin/torch_tb_profiler/profiler/tensor_core.py,
# from NVIDIA PyProf's tc.py), plus the names of newer tensor-core kernels: CUTLASS/cuBLAS "tensorop",
# Hopper's cuBLAS "nvjet" and warpgroup "gmma", flash attention, and the WMMA API ("wmma", also AMD's rocWMMA).
NVIDIA_TENSOR_CORE_MARKERS = (
    "h884", "s884", "h1688", "s1688", "hmma", "i8816", "16816", "dgrad_1x1_stride_2x2",
    "first_layer_wgrad_kernel", "conv1x1", "conv2d_c1_k1", "direct_group", "xmma_implicit_gemm",
    "xmma_sparse_conv", "xmma_warp_specialized_implicit_gemm", "xmma_gemm", "xmma_sparse_gemm", "c1688",
    "tensorop", "nvjet", "gmma", "flash_fwd", "flash_bwd", "wmma",
)  # fmt: skip
# AMD matrix cores (CDNA's MFMA instructions, "XDLOPS" in AMD's libraries), one alternative a source:
AMD_MATRIX_CORE_PATTERNS = (
    # Tensile / hipBLASLt's TensileLite (rocBLAS, hipBLASLt GEMMs: "Cijk_Alik_Bljk_BBS_BH_MT128x128x64_
    # MI16x16x1_..."): the solution name carries "MI<M>x<N>x<B>" when the kernel uses the MatrixInstruction
    # parameter (Tensile docs, "Kernel parameters": MatrixInstruction; name built in SolutionStructs/Naming.py).
    r"_MI\d+x\d+x\d+",
    # composable_kernel (MIOpen, hipBLASLt, aiter, PyTorch's CK backend): XDL device ops and kernels,
    # "kernel_gemm_xdl_cshuffle_v3", "kernel_grouped_conv_fwd_xdl_...", "kernel_batched_gemm_xdl<...>" and the
    # older "..._xdlops_v2r3" (ROCm/composable_kernel include/ck/tensor_operation/gpu/grid/gridwise_*xdl*.hpp;
    # its "dl"/"dlops" kernels run on the vector ALUs and are not matched).
    r"_xdl(?:ops)?(?![a-z])",
    # MIOpen's implicit-GEMM assembly kernels (ROCm/MISA igemm/algo/igemm_base.py,
    # igemm_gtc_encode_kernel_base_name): "igemm_fwd_gtcx_", "gtcx2_" (gfx90a), "gtcx3_" (gfx942), "gtcx35_"
    # (gfx950) are "generic tensor contraction with xdlops", "gtcw_" with WMMA; "gtc_"/"gtcm_" (dlops, mac) not.
    r"igemm_[a-z]+_gtc[xw]\d*_",
    # MIOpen's older XDLOPS solvers ("gridwise_convolution_implicit_gemm_v4r4_xdlops_...") and hand-written
    # kernels named after the instruction (aiter's "mfma_moe1_..." and others).
    r"xdlops",
    r"mfma",
)
AMD_MATRIX_CORE_KERNEL = re.compile("|".join(AMD_MATRIX_CORE_PATTERNS))


@functools.cache  # a few hundred distinct (interned) names against ~1e5 events
def is_matrix_core_kernel(kernel_name: str) -> bool:
    """The kernel runs on matrix cores (NVIDIA tensor cores or AMD MFMA), as its name tells."""
    return (
        any(marker in kernel_name for marker in NVIDIA_TENSOR_CORE_MARKERS)
        or AMD_MATRIX_CORE_KERNEL.search(kernel_name) is not None
    )


# Operators whose work matrix cores can run (tensor-core eligible): torch-tb-profiler's TC_OP_Allowlist (the
# operators autocast runs in half precision) by name pattern, so that torch 2.x names match too
# (aten::convolution_backward, autograd "MmBackward0", scaled_dot_product...), ROCm's twins of cudnn_convolution
# (aten::miopen_convolution, miopen_depthwise_convolution, ...), and Inductor's Triton templates (the record
# function of "triton_tem_fused_mm_0" and its kernel: mm, addmm, bmm, convolution, flex attention). The loader
# keeps the input types of these operators only.
TENSOR_CORE_ELIGIBLE = re.compile(
    r"(^|::|: )(_?convolution\w*|conv\w*|cudnn_convolution\w*|miopen_\w*convolution\w*|prelu|addmm_?|addmv_?"
    r"|addr|matmul|mm|mv|linear|addbmm|baddbmm|bmm|_scaled_mm|chain_matmul|linalg_multi_dot|_thnn_fused_\w+_cell"
    r"|lstm_cell|gru_cell|rnn_\w+_cell|\w*scaled_dot_product\w*|_flash_attention\w*|_efficient_attention\w*)$"
    r"|(Convolution\w*|Bmm|Mm|Addmm|Addmv|Mv|Addbmm|Baddbmm)Backward\d*$"
)
TRITON_TEMPLATE_PREFIX = "triton_tem_"


@functools.cache  # a few hundred distinct (interned) names against ~1e5 events
def is_tensor_core_eligible(operator: str | None) -> bool:
    """The operator's (or Triton template's) work is matmul or convolution that matrix cores can run."""
    return operator is not None and (
        TENSOR_CORE_ELIGIBLE.search(operator) is not None or operator.startswith(TRITON_TEMPLATE_PREFIX)
    )


# ---------------------------------------------------------------------------------------------------------
# (b) Runtime calls that launch GPU work: their host time is the launch overhead
# ---------------------------------------------------------------------------------------------------------

# CUDA runtime API ("Execution Control": cudaLaunchKernel, cudaLaunchKernelExC, cudaLaunchCooperativeKernel;
# "Graph Management": cudaGraphLaunch; "cudaLaunch" before CUDA 9) and driver API (cuLaunchKernel,
# cuLaunchKernelEx, cuLaunchCooperativeKernel, cuGraphLaunch; cuLaunchGrid* deprecated).
CUDA_LAUNCH_CALLS = frozenset(
    {
        "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchKernel_ptsz", "cudaLaunchKernelExC_ptsz",
        "cudaLaunchCooperativeKernel", "cudaLaunchCooperativeKernelMultiDevice", "cudaGraphLaunch",
        "cudaLaunch", "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuGraphLaunch",
        "cuLaunchGrid", "cuLaunchGridAsync",
    }
)  # fmt: skip
# HIP runtime API ("Execution Control" and "Module Management" of the HIP API reference): hipLaunchKernel,
# hipExtLaunchKernel, hipModuleLaunchKernel (Triton and torch.compile kernels), hipExtModuleLaunchKernel
# (rocBLAS/hipBLASLt/MIOpen code objects), the cooperative and multi-device ones, hipGraphLaunch, and the
# deprecated hipLaunchByPtr / hipHccModuleLaunchKernel of older ROCm.
HIP_LAUNCH_CALLS = frozenset(
    {
        "hipLaunchKernel", "hipLaunchKernel_spt", "hipExtLaunchKernel", "hipLaunchKernelExC",
        "hipModuleLaunchKernel", "hipModuleLaunchKernelExt", "hipExtModuleLaunchKernel",
        "hipHccModuleLaunchKernel", "hipLaunchCooperativeKernel", "hipLaunchCooperativeKernelMultiDevice",
        "hipModuleLaunchCooperativeKernel", "hipModuleLaunchCooperativeKernelMultiDevice",
        "hipExtLaunchMultiKernelMultiDevice", "hipGraphLaunch", "hipGraphLaunch_spt", "hipLaunchByPtr",
    }
)  # fmt: skip
LAUNCH_CALLS = CUDA_LAUNCH_CALLS | HIP_LAUNCH_CALLS
# Name parts of the launch calls of both APIs, for versioned or suffixed names not listed above
# ("cuLaunchKernel_v2", "..._ptsz", "..._spt").
LAUNCH_CALL_MARKERS = ("LaunchKernel", "GraphLaunch", "LaunchCooperativeKernel", "ModuleLaunchKernel")


@functools.cache  # a few hundred distinct (interned) names against ~1e5 events
def is_launch_call(name: str) -> bool:
    """The runtime call launches GPU work (CUDA or HIP)."""
    return name in LAUNCH_CALLS or any(marker in name for marker in LAUNCH_CALL_MARKERS)


# ---------------------------------------------------------------------------------------------------------
# (c) Runtime calls that hold the host until the GPU catches up
# ---------------------------------------------------------------------------------------------------------

# Calls that wait for the GPU by definition. CUDA runtime API: the synchronize calls, and the synchronous
# cudaMemcpy/cudaMemcpy2D/cudaMemset ("API synchronization behavior"); cudaFree synchronizes the device and
# device and page-locked host allocations are implicitly synchronizing (CUDA C++ Programming Guide, "Implicit
# Synchronization"; NVIDIA, "Using the NVIDIA CUDA Stream-Ordered Memory Allocator"). Driver API: the
# cu*Synchronize calls. HIP: the twins of the same calls (HIP API reference: hipFree and hipHostFree "perform
# an implicit hipDeviceSynchronize() call"); hipMemcpyWithStream is synchronous: PyTorch's ROCm build calls it
# where CUDA calls cudaMemcpyAsync + cudaStreamSynchronize (c10/cuda/CUDAFunctions.h, memcpy_and_sync).
SYNC_CALLS = (
    frozenset(
        f"{prefix}{what}"
        for prefix in ("cuda", "hip")
        for what in (
            "DeviceSynchronize", "StreamSynchronize", "EventSynchronize", "Memcpy", "Memcpy2D", "Memset",
            "Free", "Malloc",
        )
    )
    | frozenset({"cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize"})
    | frozenset({"cudaFreeHost", "cudaMallocHost", "cudaHostAlloc"})
    | frozenset({"hipHostFree", "hipFreeHost", "hipHostMalloc", "hipMallocHost", "hipHostAlloc"})
    | frozenset({"hipMemcpyWithStream", "hipMemcpyHtoD", "hipMemcpyDtoH", "hipMemcpyDtoD"})
)  # fmt: skip
# Asynchronous copies: they block only from or to pageable memory, or when they wait long (see host_calls).
ASYNC_COPY_CALLS = frozenset(
    {
        "cudaMemcpyAsync", "cudaMemcpy2DAsync", "cuMemcpyAsync",
        "hipMemcpyAsync", "hipMemcpy2DAsync", "hipMemcpyHtoDAsync", "hipMemcpyDtoHAsync", "hipMemcpyDtoDAsync",
    }
)  # fmt: skip


def is_sync_call(name: str) -> bool:
    """The runtime call waits for the GPU whatever it copies (CUDA or HIP)."""
    return name in SYNC_CALLS


def is_async_copy_call(name: str) -> bool:
    return name in ASYNC_COPY_CALLS


# ---------------------------------------------------------------------------------------------------------
# (d) Communication kernels
# ---------------------------------------------------------------------------------------------------------

# HTA's get_kernel_type and torch-tb-profiler's event_parser.py: NCCL kernels ("ncclKernel_...",
# "ncclDevKernel_...") are communication. RCCL, the ROCm port, keeps the nccl names, and its MSCCL kernels
# are "mscclKernel_<op>_<type>_<proto>" (ROCm/rccl src/include/msccl/msccl_kernel.h); "rccl" for RCCL's own.
# gloo moves data with memcpy, not kernels of its own.
COMMUNICATION_KERNEL_MARKERS = ("nccl", "rccl", "msccl")


@functools.cache  # a few hundred distinct (interned) names against ~1e5 events
def is_communication_kernel_name(name: str) -> bool:
    """The kernel is a collective's (NCCL, RCCL, MSCCL), by name, case-insensitively."""
    lowered = name.lower()
    return any(marker in lowered for marker in COMMUNICATION_KERNEL_MARKERS)
