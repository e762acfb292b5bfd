"""Diagnosis rules about the accelerator: cuDNN autotuning, GPU utilization, precision.

Each rule is ``(summary, verdict) -> Finding | None``: silent when its evidence is absent.
"""

from __future__ import annotations

from lightning_perf.analysis.gpu_measures import gpu_busy_measures
from lightning_perf.analysis.numbers import finite as _num
from lightning_perf.analysis.numbers import fmt1 as _fmt
from lightning_perf.analysis.probe_results import CudnnAB
from lightning_perf.analysis.rules.helpers import on_cuda
from lightning_perf.analysis.rules.thresholds import (
    BF16_MIN_CC,
    FULL_PRECISION,
    LOW_GPU_UTIL_PCT,
    TENSOR_CORE_MIN_CC,
    VERDICTS,
)
from lightning_perf.analysis.summary import Finding, RunSummary

# The cudnn.benchmark A/B recommends the flag only when it measured at least a 5% gain. Our choice: the A/B
# takes medians of 5 passes each way, whose run-to-run spread on a busy GPU is a few percent; below 5% the
# gain is not told apart from noise, and benchmark=True costs an autotuning pass per new shape.
CUDNN_MIN_SPEEDUP = 1.05
# torch.get_float32_matmul_precision() values that already run fp32 matmuls on tensor cores (TF32 or bf16)
TF32_PRECISIONS = ("high", "medium")
HALF_MIXED = ("16-mixed", "16")


def _ab(summary: RunSummary) -> CudnnAB | None:
    """The cudnn.benchmark A/B where it ran and measured a speed-up; else None."""
    ab = summary.probes.cudnn_benchmark
    if ab is not None and ab.applies and _num(ab.speedup) is not None:
        return ab
    return None


def cudnn_benchmark(summary: RunSummary, verdict: str | None) -> Finding | None:
    settings = summary.settings
    if not on_cuda(summary) or settings.cudnn_benchmark is not False or settings.model_has_conv is not True:
        return None
    evidence = "torch.backends.cudnn.benchmark is off and the model has convolutions"
    if settings.cudnn_deterministic:
        return Finding(
            id="cudnn_benchmark",
            severity="info",
            title="cuDNN autotuning is off for determinism",
            evidence=evidence + ", but cudnn.deterministic=True was requested.",
            recommendation="Keep it off: benchmark=True would let cuDNN pick non-deterministic algorithms.",
        )
    ab = _ab(summary)
    if ab is not None:
        return _measured(ab, evidence)
    if settings.input_shapes_vary:
        return Finding(
            id="cudnn_benchmark",
            severity="info",
            title="cuDNN autotuning is off (input shapes vary)",
            evidence=evidence + ", and input shapes vary between batches.",
            recommendation="Keep it off: benchmark=True re-tunes every new shape, which costs more than it "
            "saves unless shapes are padded or bucketed to a few sizes.",
        )
    constant = settings.input_shapes_vary is False
    return Finding(
        id="cudnn_benchmark",
        severity="medium" if constant else "low",
        title="cuDNN autotuning is off",
        evidence=evidence + (" and input shapes are constant." if constant else " (input shapes not known)."),
        recommendation="Set `Trainer(benchmark=True)` so cuDNN picks the fastest convolution algorithms"
        + ("." if constant else ", if every batch has the same shape."),
        settings_change={"benchmark": True},
    )


def _measured(ab: CudnnAB, evidence: str) -> Finding:
    speedup = float(ab.speedup or 0.0)  # measured: see _ab
    timed = (
        f"; the A/B at the end of training timed a forward+backward pass at {_fmt(ab.off_ms)} ms off "
        f"and {_fmt(ab.on_ms)} ms on ({speedup:.2f}x)"
    )
    if speedup >= CUDNN_MIN_SPEEDUP:
        return Finding(
            id="cudnn_benchmark",
            severity="medium",
            title=f"cuDNN autotuning is off; turning it on measured {speedup:.2f}x faster",
            evidence=evidence + timed + ".",
            recommendation="Set `Trainer(benchmark=True)`: the measured pass was "
            f"{(1 - 1 / speedup) * 100:.0f}% shorter with it.",
            settings_change={"benchmark": True},
        )
    outcome = "a slowdown" if speedup < 1.0 else f"less than the {CUDNN_MIN_SPEEDUP:.2f}x worth changing for"
    return Finding(
        id="cudnn_benchmark",
        severity="info",
        title="cuDNN autotuning would not help this model",
        evidence=evidence + timed + f": {outcome}.",
        recommendation="Keep `benchmark` off: autotuning measured no worthwhile gain here.",
    )


def low_gpu_util(summary: RunSummary, verdict: str | None) -> Finding | None:
    measures = gpu_busy_measures(summary)
    if not measures or verdict != VERDICTS[2]:
        return None
    # "idle" only when every measure agrees: NVML samples and the traces cover different moments
    if any(value >= LOW_GPU_UTIL_PCT for _label, value in measures):
        return None
    busiest = max(value for _label, value in measures)
    named = ", ".join(f"{label} {_fmt(value)}%" for label, value in measures)
    batch = summary.settings.batch_size
    change = {"batch_size": batch * 2} if batch else {}
    return Finding(
        id="low_gpu_util",
        severity="medium",
        title="The GPU is idle most of the time",
        evidence=f"GPU busy at most {_fmt(busiest)}% ({named}; below {_fmt(LOW_GPU_UTIL_PCT)}%) while not "
        f"input-bound (data wait {_fmt(summary.timing.data_wait_pct)}%)"
        + (f", batch size {batch}." if batch else "."),
        recommendation="Give the GPU more work per launch: a larger batch"
        + (f" (e.g. {batch * 2})" if batch else "")
        + ", fewer host syncs (`.item()`, printing, `sync_dist=True` every step) and mixed precision.",
        settings_change=change,
    )


def _compute_capability(summary: RunSummary) -> list[int] | None:
    gpu = summary.utilization.gpu
    for cc in (summary.settings.compute_capability, gpu.compute_capability if gpu else None):
        if cc and isinstance(cc[0], int):
            return list(cc)
    return None  # neither torch nor NVML gave it


def mixed_precision(summary: RunSummary, verdict: str | None) -> Finding | None:
    settings, gpu = summary.settings, summary.utilization.gpu
    cc = _compute_capability(summary)
    if not on_cuda(summary) or cc is None or cc[0] < TENSOR_CORE_MIN_CC:
        return None
    precision = str(settings.precision) if settings.precision is not None else None
    name = (gpu.device_name if gpu else None) or settings.gpu_name or "the GPU"
    on = f"{name} (compute capability {'.'.join(str(v) for v in cc)})"
    if precision in HALF_MIXED and cc[0] >= BF16_MIN_CC:
        return Finding(
            id="mixed_precision",
            severity="low",
            title="fp16 mixed precision where bf16 is available",
            evidence=f"precision={precision} on {on}, which has bfloat16 (from {BF16_MIN_CC}.0).",
            recommendation='Set `Trainer(precision="bf16-mixed")`: the same tensor-core speed without loss '
            "scaling and its overflow-skipped steps.",
            settings_change={"precision": "bf16-mixed"},
        )
    if precision is not None and precision not in FULL_PRECISION:
        return None
    target = "bf16-mixed" if cc[0] >= BF16_MIN_CC else "16-mixed"
    tf32 = settings.float32_matmul_precision in TF32_PRECISIONS or settings.matmul_allow_tf32 is True
    if tf32:
        return Finding(
            id="mixed_precision",
            severity="low",
            title="Full precision with TF32 matmuls: mixed precision would go further",
            evidence=f"precision={precision or '32-true (default)'} on {on}; fp32 matmuls already run on tensor "
            f"cores (float32_matmul_precision={settings.float32_matmul_precision!r}, "
            f"allow_tf32={settings.matmul_allow_tf32}).",
            recommendation=f'Try `Trainer(precision="{target}")`: it also halves activation memory and traffic; '
            "the matmul gain over TF32 is smaller than over plain fp32.",
            settings_change={"precision": target},
        )
    return Finding(
        id="mixed_precision",
        severity="medium",
        title="Training in full precision on a GPU with tensor cores",
        evidence=f"precision={precision or '32-true (default)'} on {on}, tensor cores from "
        f"{TENSOR_CORE_MIN_CC}.0, and fp32 matmuls do not use them (float32_matmul_precision="
        f"{settings.float32_matmul_precision or 'highest'!r}).",
        recommendation=f'Set `Trainer(precision="{target}")` to run matmuls and convolutions on tensor '
        'cores (or at least `torch.set_float32_matmul_precision("high")`).',
        settings_change={"precision": target},
    )
