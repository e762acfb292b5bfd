"""Diagnosis rules about the accelerator: cuDNN autotuning, GPU utilization, precision.

Each rule is ``(summary, verdict) -> Finding | None``: silent when its evidence is absent.
"""

from __future__ import annotations

from lightning_perf.analysis.numbers import finite as _num
from lightning_perf.analysis.numbers import fmt1 as _fmt
from lightning_perf.analysis.rule_helpers import on_cuda
from lightning_perf.analysis.summary import Finding, RunSummary
from lightning_perf.analysis.thresholds import (
    BF16_MIN_CC,
    FULL_PRECISION,
    LOW_GPU_UTIL_PCT,
    TENSOR_CORE_MIN_CC,
    VERDICTS,
)


def cudnn_benchmark(summary: RunSummary, verdict: str | None) -> Finding | None:
    settings = summary.settings
    if not on_cuda(summary) or settings.cudnn_benchmark is not False or settings.model_has_conv is not True:
        return None
    evidence = "torch.backends.cudnn.benchmark is off and the model has convolutions"
    # off for a good reason: said as information, with why it should stay off
    reasons = [
        (
            settings.cudnn_deterministic,
            "for determinism",
            ", but cudnn.deterministic=True was requested.",
            "benchmark=True would let cuDNN pick non-deterministic algorithms.",
        ),
        (
            settings.input_shapes_vary,
            "(input shapes vary)",
            ", and input shapes vary between batches.",
            "benchmark=True re-tunes every new shape, which costs more than it saves unless shapes are "
            "padded or bucketed to a few sizes.",
        ),
    ]
    for applies, why, detail, keep_off in reasons:
        if applies:
            return Finding(
                id="cudnn_benchmark",
                severity="info",
                title=f"cuDNN autotuning is off {why}",
                evidence=evidence + detail,
                recommendation=f"Keep it off: {keep_off}",
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


def low_gpu_util(summary: RunSummary, verdict: str | None) -> Finding | None:
    gpu = summary.utilization.gpu
    util = _num(gpu.util_pct) if gpu else None
    if util is None or util >= LOW_GPU_UTIL_PCT or verdict != VERDICTS[2]:
        return None
    batch = summary.settings.batch_size
    change = {"batch_size": batch * 2} if batch else {}
    return Finding(
        id="low_gpu_util",
        severity="medium",
        title="The GPU is idle most of the time",
        evidence=f"GPU utilization is {_fmt(util)}% (below {_fmt(LOW_GPU_UTIL_PCT)}%) while not input-bound "
        f"(data wait {_fmt(summary.timing.data_wait_pct)}%)" + (f", batch size {batch}." if batch else "."),
        recommendation="Give the GPU more work per launch: a larger batch"
        + (f" (e.g. {batch * 2})" if batch else "")
        + ", fewer host syncs (`.item()`, printing, `sync_dist=True` every step) and mixed precision.",
        settings_change=change,
    )


def mixed_precision(summary: RunSummary, verdict: str | None) -> Finding | None:
    settings, gpu = summary.settings, summary.utilization.gpu
    cc = gpu.compute_capability if gpu else None
    if not on_cuda(summary) or not cc or not isinstance(cc[0], int) or cc[0] < TENSOR_CORE_MIN_CC:
        return None
    if settings.precision is not None and str(settings.precision) not in FULL_PRECISION:
        return None
    target = "bf16-mixed" if cc[0] >= BF16_MIN_CC else "16-mixed"
    name = gpu.device_name or settings.gpu_name or "the GPU"
    return Finding(
        id="mixed_precision",
        severity="medium",
        title="Training in full precision on a GPU with tensor cores",
        evidence=f"precision={settings.precision or '32-true (default)'} on {name} "
        f"(compute capability {'.'.join(str(v) for v in cc)}, tensor cores from {TENSOR_CORE_MIN_CC}.0).",
        recommendation=f'Set `Trainer(precision="{target}")` to run matmuls and convolutions on tensor '
        "cores.",
        settings_change={"precision": target},
    )
