"""Diagnosis rule about how far the run is from its device's limit: ``low_mfu``.

The model FLOPs utilization (``compute_limit``: a step's FLOPs per second of the mean step, against the matmul
peak measured on this device in the run's dtype) says whether arithmetic fills the step; the cause is named from
what was measured: the FLOPs per counted operator (how long each matmul would take at the peak, against the
per-operator cost of PyTorch's eager dispatch and a kernel launch), the trace's operators that are not matmuls,
and the dtype against the datasheet's faster ones. Silent for input-bound runs (input is the first fix) and
without a measured peak. ``(summary, verdict) -> Finding | None`` like every rule.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any

from lightning_perf.analysis.compute.datasheet_peaks import lookup
from lightning_perf.analysis.compute.limit import ComputeLimit, flops_text, pct_text
from lightning_perf.analysis.numbers import finite
from lightning_perf.analysis.rules.helpers import on_cuda
from lightning_perf.analysis.rules.thresholds import BF16_MIN_CC, FULL_PRECISION, VERDICTS
from lightning_perf.analysis.summary import Finding, RunSummary

# Below this share of the measured peak, arithmetic does not fill the step. Our choice: large matmuls alone reach
# 80-95% of the peak measured the same way (benchmarks/README.md), and a real model's step also has elementwise
# operators, the optimizer and the loop: under 40% more than half the step is something else.
LOW_MFU_PCT = 40.0
# Under 10% the step is mostly not arithmetic: a medium finding.
VERY_LOW_MFU_PCT = 10.0
# A matmul shorter than this at the peak is dominated by what every operator costs besides its arithmetic:
# PyTorch's eager dispatch takes ~5-10 us an operator on a CPU, a CUDA kernel launch ~5 us (our choice: the
# upper end, where the operator's own work is no longer the larger part).
OVERHEAD_US = 10.0
# A step's matmuls are "small" when their mean is this far below the size the peak was measured at (the FLOPs of
# an n x n by n x n matmul at half the measured n are an eighth of it: far from where the peak is reached)
SMALL_MATMUL_SHARE = 0.5
# The trace's non-matmul operators take at least this share of a step: memory-bound work (elementwise,
# normalization, copies) is a cause. Our choice: a third of the step, more than the matmuls' share at 40% MFU.
MEMORY_BOUND_PCT = 33.0
# Operators that do the arithmetic FlopCounterMode counts
_MATMUL = re.compile(
    r"mm|matmul|linear|conv|attention|sdpa|einsum|gemm|cutlass|xmma|cudnn|flash|fmha|wgrad|dgrad",
    re.IGNORECASE,
)
# datasheet dtypes faster than fp32 on the same device, the usual switch first
_FASTER = ("bf16", "tf32", "fp16")


class CauseKind(enum.Enum):
    """What limits the MFU; the advice is chosen by kind, never by a cause's words."""

    OVERHEAD = "launch/framework overhead"
    SMALL_MATMULS = "small matmuls"
    MEMORY_BOUND = "memory-bound operators"
    PRECISION = "precision"
    REST_OF_STEP = "the rest of the step"


@dataclass(frozen=True)
class Cause:
    """One measured cause of a low MFU: its kind, and the sentence the evidence shows."""

    kind: CauseKind
    text: str


def low_mfu(summary: RunSummary, verdict: str | None) -> Finding | None:
    limit = summary.compute_limit
    mfu = finite(limit.mfu_pct) if limit is not None else None
    if limit is None or mfu is None or verdict != VERDICTS[2] or mfu >= LOW_MFU_PCT:
        return None
    causes = _causes(limit, summary)
    change = compute_changes(summary)
    modules = _modules(limit, summary)
    evidence = (
        f"MFU {pct_text(mfu)}%: {flops_text(limit.step.flops)} a step at {flops_text(limit.achieved_flops_per_s or 0)}"
        f"/s against this device's measured {flops_text(limit.peak.measured_flops_per_s or 0)}/s "
        f"{limit.peak.dtype} matmul, while not input-bound. "
        + " ".join(f"{c.text[0].upper()}{c.text[1:]}." for c in causes)
        + (f" The FLOPs sit in {modules}." if modules else "")
    )
    return Finding(
        id="low_mfu",
        severity="medium" if mfu < VERY_LOW_MFU_PCT else "low",
        title=f"The step uses {pct_text(mfu)}% of the device's matmul peak",
        evidence=evidence,
        recommendation=_advice(causes, change),
        settings_change=change,
    )


def compute_changes(summary: RunSummary) -> dict[str, Any]:
    """The compute settings `tune` can measure for a low MFU, each in its own candidate: bf16 autocast where the
    run asked for full precision (a CPU, or a GPU with bf16), TF32 matmuls on such a GPU, ``torch.compile``
    where nothing was compiled, channels_last for a model with convolutions."""
    settings = summary.settings
    cuda = on_cuda(summary)
    cc = settings.compute_capability
    ampere = bool(cuda and cc and cc[0] >= BF16_MIN_CC)
    full = settings.precision is None or str(settings.precision) in FULL_PRECISION
    change: dict[str, Any] = {}
    if full and (ampere or not cuda):
        change["precision"] = "bf16-mixed"
    if full and ampere and settings.float32_matmul_precision in (None, "highest"):
        change["matmul_precision"] = "high"
    if summary.compile is None or not summary.compile.compiles:
        change["compile"] = True
    if settings.model_has_conv:
        change["channels_last"] = True
    return change


def _causes(limit: ComputeLimit, summary: RunSummary) -> list[Cause]:
    """What limits the MFU, in measured words, the strongest first."""
    causes: list[Cause] = []
    step, peak = limit.step, limit.peak
    calls = step.calls
    step_ms = limit.step_time_ms or 0.0
    if calls and peak.measured_flops_per_s:
        per_call = step.flops / calls
        at_peak_us = per_call / peak.measured_flops_per_s * 1e6
        if at_peak_us < OVERHEAD_US:
            text = (
                f"launch/framework overhead: the step's {calls} counted operators average "
                f"{flops_text(per_call)}, {at_peak_us:.2g} us each at the peak, against ~{OVERHEAD_US:.0f} us "
                f"PyTorch spends on any operator (dispatch, Python, a kernel launch); all of the step's FLOPs "
                f"take {step.flops / peak.measured_flops_per_s * 1e3:.2g} ms at the peak of its {step_ms:.2g} ms"
            )
            causes.append(Cause(CauseKind.OVERHEAD, text))
        elif peak.measured_size and per_call < 2.0 * (SMALL_MATMUL_SHARE * peak.measured_size) ** 3:
            side = (per_call / 2.0) ** (1 / 3)
            text = (
                f"small matmuls: the step's {calls} counted operators average {flops_text(per_call)}, the "
                f"size of a {side:.0f}-square matmul, where the peak was measured at {peak.measured_size}-square"
            )
            causes.append(Cause(CauseKind.SMALL_MATMULS, text))
    memory = _memory_bound(summary)
    if memory:
        causes.append(memory)
    precision = _precision(limit)
    if precision:
        causes.append(precision)
    if not causes:
        text = (
            "the counted matmuls are large enough, so the rest of the step (optimizer, loss, data movement, "
            "the loop) takes the time: the trace's operators show which"
        )
        causes.append(Cause(CauseKind.REST_OF_STEP, text))
    return causes


def _memory_bound(summary: RunSummary) -> Cause | None:
    """The profiled step's non-matmul work, when it takes a third of the step or more: its GPU kernels where it
    recorded some, else its aten operators' self CPU time (Lightning's and Python's own ranges are no operator)."""
    figures = next((f for f in summary.trace_figures if f.top_operators and f.step_ms), None)
    if figures is None:
        return None
    kernels = bool(figures.top_kernels)
    ops = (
        figures.top_kernels
        if kernels
        else [op for op in figures.top_operators if op.name.startswith("aten::")]
    )
    others = [op for op in ops if not _MATMUL.search(op.name)]
    share = sum(op.ms_per_step for op in others) / figures.step_ms * 100.0
    if share < MEMORY_BOUND_PCT:
        return None
    names = ", ".join(op.name[:60] for op in others[:3])
    text = (
        f"memory-bound operators: {names} and the other non-matmul {'kernels' if kernels else 'operators'} of "
        f"the profiled step take {share:.0f}% of it ({'GPU kernel' if kernels else 'self CPU'} time)"
    )
    return Cause(CauseKind.MEMORY_BOUND, text)


def _precision(limit: ComputeLimit) -> Cause | None:
    peak = limit.peak
    if peak.dtype != "fp32" or peak.device == "cpu" or not peak.datasheet_flops_per_s:
        return None
    for dtype in _FASTER:
        faster = lookup(peak.device_name, dtype)
        if faster is not None and faster[1] >= 2 * peak.datasheet_flops_per_s:
            text = (
                f"precision: fp32 matmuls on a {peak.datasheet_device}, whose datasheet gives {dtype} "
                f"{faster[1] / peak.datasheet_flops_per_s:.0f}x the fp32 rate"
            )
            return Cause(CauseKind.PRECISION, text)
    return None


def _modules(limit: ComputeLimit, summary: RunSummary) -> str:
    """The leaf modules holding most of the counted FLOPs, with their share; joined with the module table of a
    profiled cycle (its forward and backward time a step, by module path), the rate each reached in it."""
    total = limit.step.flops
    if not total:
        return ""
    table = next((f.modules for f in summary.trace_figures if f.modules), [])
    times = {m.path: m for m in table}
    peak = limit.peak.measured_flops_per_s if limit.peak else None
    named = []
    for module in [m for m in limit.step.modules if m.leaf][:3]:
        text = f"{module.path} ({module.flops / total * 100:.0f}%"
        row = times.get(module.path)
        gpu_ms = (row.gpu_forward_ms + row.gpu_backward_ms) if row is not None else 0.0
        ms = gpu_ms or ((row.forward_ms + row.backward_ms) if row is not None else 0.0)
        if ms > 0 and peak:
            rate = module.flops / (ms / 1e3)
            text += f": {ms:.3g} ms a profiled step, {pct_text(rate / peak * 100)}% of the peak"
        named.append(text + ")")
    return ", ".join(named)


def _advice(causes: list[Cause], change: dict[str, Any]) -> str:
    kinds = {cause.kind for cause in causes}
    small = bool(kinds & {CauseKind.OVERHEAD, CauseKind.SMALL_MATMULS})
    memory = CauseKind.MEMORY_BOUND in kinds
    steps = ["give each operator more work: a larger batch or wider layers"] if small else []
    if small or memory:
        steps.append(
            "fuse operators with `torch.compile`"
            + (" (the elementwise and normalization ones above first)" if memory else "")
            + (", on a GPU also CUDA graphs" if CauseKind.OVERHEAD in kinds else "")
        )
    if CauseKind.PRECISION in kinds:
        steps.append(
            '`Trainer(precision="bf16-mixed")` (or at least `torch.set_float32_matmul_precision("high")`)'
        )
    elif "precision" in change:  # bf16 autocast pays where the device has bf16 units: measure it
        steps.append('try `Trainer(precision="bf16-mixed")` (on a CPU it pays with AMX or AVX512-BF16)')
    if change.get("compile") and not (small or memory):
        steps.append("try `torch.compile`")
    if change.get("channels_last"):
        steps.append(
            "for the convolutions, `model.to(memory_format=torch.channels_last)` and channels_last batches"
        )
    if not steps:
        steps.append("look at the trace's top operators outside the matmuls (`lightning-perf report`)")
    text = "; ".join(steps)
    return text[0].upper() + text[1:] + "."
