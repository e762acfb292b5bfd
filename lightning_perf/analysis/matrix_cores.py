"""Whether matmul and convolution work ran on matrix cores (NVIDIA tensor cores, AMD MFMA), decided by what the
operators computed rather than by what their kernels are called.

A half-precision (fp16, bf16, fp8) matmul or convolution runs on matrix cores on every GPU that has them for that
type (NVIDIA: fp16 from compute capability 7.0, bf16 and TF32 from 8.0; AMD CDNA's MFMA), whatever
library or compiler wrote its kernel (cuBLAS, hipBLASLt, MIOpen's ``igemm_*``, composable_kernel, Triton). fp32
runs on them only with TF32 (AMD: XF32 on MI300) switched on: ``torch.set_float32_matmul_precision("high")`` or
``allow_tf32`` for matmuls, ``torch.backends.cudnn.allow_tf32`` for convolutions. So, for each kernel of a
tensor-core-eligible operator, in order:

1. the operator's input types (``Input type`` of traces recorded with ``record_shapes=True``);
2. else the run's precision setting (the summary's ``precision``, e.g. ``bf16-mixed``);
3. for fp32, the run's TF32 settings (the summary's ``float32_matmul_precision``, ``matmul_allow_tf32``,
   ``cudnn_allow_tf32``) and whether the GPU has TF32 at all;
4. else, or where the type says nothing (fp64, types unknown), the kernel-name tables of traces/vendors.py.

:func:`matrix_core_split` says how much eligible kernel time ran without matrix cores and what decided it.
Pure: standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lightning_perf.analysis.trace_figures import TraceFigures

# What decided a share (the words the evidence uses)
BY_TYPES, BY_PRECISION, BY_NAMES = "input types", "the run's precision setting", "kernel names"
UNKNOWN = "unknown"
HALF_DTYPES = ("fp16", "bf16", "fp8")
# torch.get_float32_matmul_precision() values that run fp32 matmuls on tensor cores (TF32 or bf16 passes)
TF32_MATMUL_PRECISIONS = ("high", "medium")
# NVIDIA compute capabilities: tensor cores for fp16 from 7.0 (Volta), bf16 and TF32 from 8.0 (Ampere): the CUDA
# C++ Programming Guide's "Warp Matrix Functions" and the architecture whitepapers
FP16_MIN_CC, BF16_TF32_MIN_CC = (7, 0), (8, 0)
# AMD: XF32 (TF32's twin) on CDNA3 (gfx942, MI300: ROCm reports compute capability 9.4); CDNA1/2 have none
AMD_XF32_CC = (9, 4)
AMD_MARKERS = ("AMD", "Instinct", "Radeon")
# AMD GPUs without matrix cores: RDNA1/2 (gfx10xx, compute capability 10.x; WMMA came with RDNA3's gfx11), and
# Vega (gfx906/gfx900: MI50, MI60, MI25, Radeon VII), whose 9.0 is also CDNA1/2's (MI100, MI200): told by name
AMD_NO_MATRIX_CORE_MAJOR = 10
AMD_NO_MATRIX_CORE_NAMES = ("MI25", "MI50", "MI60", "Radeon VII", "Radeon Pro VII", "Vega")
# Kineto's "Input type" strings are c10's type names ("float", "c10::BFloat16", "c10::Float8_e4m3fn", ...)
_FLOATS = {"float": "fp32", "float32": "fp32", "half": "fp16", "float16": "fp16", "bfloat16": "bf16"}
_FLOATS |= {"double": "fp64", "float64": "fp64"}
# Lightning's precision settings (str(trainer.precision)) to the type the eligible operators compute in
_PRECISIONS = {
    "bf16-mixed": "bf16",
    "bf16-true": "bf16",
    "bf16": "bf16",
    "16-mixed": "fp16",
    "16-true": "fp16",
}
_PRECISIONS |= {"16": "fp16", "32-true": "fp32", "32": "fp32", "64-true": "fp64", "64": "fp64"}


def dtype_of(type_name: str) -> str | None:
    """The precision of one ``Input type`` entry: "fp32", "bf16", "fp8", ...; None for a non-float or none."""
    name = type_name.strip().removeprefix("Tensor(").removesuffix(")").removeprefix("c10::").lower()
    if name.startswith("float8"):
        return "fp8"
    return _FLOATS.get(name)


def input_dtype(types: tuple[str, ...] | None) -> str | None:
    """The precision an operator computes in: that of its first floating-point input; None when none is."""
    for type_name in types or ():
        dtype = dtype_of(type_name) if isinstance(type_name, str) else None
        if dtype is not None:
            return dtype
    return None


def precision_dtype(precision: str | None) -> str | None:
    """The type eligible operators compute in under Lightning's ``precision`` setting; None when not known."""
    return _PRECISIONS.get(str(precision).strip()) if precision is not None else None


def op_kind(operator: str) -> str:
    """ "conv" for a convolution (its TF32 switch is cuDNN's), else "matmul" (matmul, linear, attention)."""
    return "conv" if "conv" in operator.lower() else "matmul"


def tf32_mode(settings: Any, kind: str) -> bool | None:
    """Whether the run let fp32 ``kind`` work use TF32, from its settings; None when they do not say."""
    if settings is None:
        return None
    if kind == "conv":
        allowed = getattr(settings, "cudnn_allow_tf32", None)
        return allowed if isinstance(allowed, bool) else None
    precision = getattr(settings, "float32_matmul_precision", None)
    allowed = getattr(settings, "matmul_allow_tf32", None)
    if precision in TF32_MATMUL_PRECISIONS or allowed is True:
        return True
    if precision == "highest" or allowed is False:
        return False
    return None


def is_amd(device: str | None) -> bool:
    return device is not None and any(marker in device for marker in AMD_MARKERS)


def _amd_without_matrix_cores(cc: list[int] | None, device: str | None) -> bool:
    named = device is not None and any(name in device for name in AMD_NO_MATRIX_CORE_NAMES)
    return named or (cc is not None and len(cc) >= 1 and cc[0] == AMD_NO_MATRIX_CORE_MAJOR)


def has_matrix_cores(dtype: str, cc: list[int] | None, device: str | None) -> bool | None:
    """Whether the GPU has matrix cores for ``dtype`` ("tf32" for fp32 with TF32 on); None when not known."""
    if dtype == "fp8":
        return True  # torch runs fp8 matmuls (torch._scaled_mm) only where matrix cores take fp8
    if is_amd(device):
        if _amd_without_matrix_cores(cc, device):
            return False
        if dtype == "tf32":
            return None if cc is None else AMD_XF32_CC <= tuple(cc[:2]) < (10, 0)
        return dtype in HALF_DTYPES or None
    if cc is None or len(cc) < 2:
        return True if dtype in ("fp16", "bf16", "tf32") else None  # unknown GPU: assume a recent one
    least = {"fp16": FP16_MIN_CC, "bf16": BF16_TF32_MIN_CC, "tf32": BF16_TF32_MIN_CC}
    return tuple(cc[:2]) >= least[dtype] if dtype in least else None


def decide(
    kind: str, dtype: str | None, tf32: bool | None, cc: list[int] | None, device: str | None
) -> bool | None:
    """Whether ``kind`` work in ``dtype`` ran on matrix cores; None when the type cannot tell (the kernel names
    decide then)."""
    if dtype in HALF_DTYPES:
        return has_matrix_cores(dtype, cc, device)
    if dtype == "fp32":
        can = has_matrix_cores("tf32", cc, device)
        if can is False or tf32 is False:
            return False
        if tf32 is True:
            return can
    return None


@dataclass
class MatrixCoreSplit:
    """Eligible kernel time (percent of all kernel time) and the part that ran without matrix cores."""

    eligible_pct: float = 0.0
    without_pct: float = 0.0
    # eligible time by the precision it was found to compute in ("bf16", "fp32", "unknown")
    by_dtype: dict[str, float] = field(default_factory=dict)
    # the time without matrix cores by that precision
    without_by_dtype: dict[str, float] = field(default_factory=dict)
    # what decided the eligible time, and the time without matrix cores: BY_TYPES, BY_PRECISION, BY_NAMES -> %
    decided_by: dict[str, float] = field(default_factory=dict)
    without_decided_by: dict[str, float] = field(default_factory=dict)

    @property
    def half_pct(self) -> float:
        return sum(self.by_dtype.get(d, 0.0) for d in HALF_DTYPES)

    def reasons(self) -> list[str]:
        """What decided the time without matrix cores (where there is none, the eligible time), largest first."""
        shares = self.without_decided_by or self.decided_by
        return [name for name, pct in sorted(shares.items(), key=lambda kv: -kv[1]) if pct > 0]


def _add(shares: dict[str, float], key: str, value: float) -> None:
    shares[key] = shares.get(key, 0.0) + value


def matrix_core_split(
    eligible_by: Mapping[str, list[float]],
    cc: list[int] | None,
    device: str | None,
    settings: Any = None,
) -> MatrixCoreSplit:
    """The split of ``eligible_by`` (``"kind/dtype"`` -> [percent of kernel time, the part in kernels whose
    names are matrix-core kernels], as :class:`~lightning_perf.analysis.trace_figures.TraceFigures` keeps it)
    under the run's ``settings`` (a summary ``Settings``; None when there is no summary)."""
    split = MatrixCoreSplit()
    run_dtype = precision_dtype(getattr(settings, "precision", None))
    for key, values in eligible_by.items():
        kind, _, dtype = key.partition("/")
        total, named = float(values[0]), float(values[1])
        source = BY_TYPES
        if dtype == UNKNOWN and run_dtype is not None:
            dtype, source = run_dtype, BY_PRECISION
        ran = decide(kind, None if dtype == UNKNOWN else dtype, tf32_mode(settings, kind), cc, device)
        if ran is None:  # the type cannot tell: the kernel names do
            source, without = BY_NAMES, max(total - named, 0.0)
        else:
            without = 0.0 if ran else total
        split.eligible_pct += total
        split.without_pct += without
        _add(split.by_dtype, dtype, total)
        _add(split.decided_by, source, total)
        if without > 0:
            _add(split.without_by_dtype, dtype, without)
            _add(split.without_decided_by, source, without)
    return split


def with_run_settings(figures: TraceFigures, settings: Any) -> None:
    """``figures``' tensor-core shares decided again with the run's ``settings`` (the summary's: precision for
    a trace without input types, TF32 for fp32 work), so the figures shown agree with the findings."""
    if settings is None or not figures.tc_eligible_by or figures.tc_eligible_without_tc_pct is None:
        return
    split = matrix_core_split(
        figures.tc_eligible_by, figures.compute_capability, figures.device_name, settings
    )
    if figures.tensor_core_pct is not None:
        figures.tensor_core_pct += figures.tc_eligible_without_tc_pct - split.without_pct
    figures.tc_eligible_without_tc_pct = split.without_pct
    figures.tc_decided_by = ", ".join(split.reasons()) or None
