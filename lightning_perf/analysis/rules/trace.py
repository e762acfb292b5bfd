"""Diagnosis rules over what a GPU trace shows (:class:`TraceFigures`), in the shape of the summary findings.

Each rule is ``(figures) -> Finding | None``, silent when its evidence is absent. :func:`diagnose_trace` runs
them all, most severe first. Pure: reads plain figures, imports nothing from torch, Lightning or traces.

The rules whose words or fix depend on what the traced steps were take ``training``: False for a trace with no
backward pass and no optimizer step (an inference benchmark, a validation or predict loop), which is then "the
run" with fixes that fit inference; True (the default) for a training step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from lightning_perf.analysis.diagnosis import input_bound_verdict
from lightning_perf.analysis.matrix_cores import (
    BY_NAMES,
    BY_PRECISION,
    HALF_DTYPES,
    UNKNOWN,
    has_matrix_cores,
    is_amd,
    matrix_core_split,
)
from lightning_perf.analysis.numbers import MB_PER_GB
from lightning_perf.analysis.numbers import fmt1 as _fmt
from lightning_perf.analysis.rules.memory import LEAK_RECOMMENDATION, capacity_finding
from lightning_perf.analysis.rules.thresholds import (
    BF16_MIN_CC,
    FULL_PRECISION,
    SEVERITY_ORDER,
    TENSOR_CORE_MIN_CC,
    VERDICTS,
)
from lightning_perf.analysis.rules.trace_thresholds import (
    EXPOSED_COMM_HIGH_PCT,
    EXPOSED_COMM_MEDIUM_PCT,
    GPU_IDLE_HIGH_PCT,
    GPU_IDLE_MEDIUM_PCT,
    HOST_SYNC_HIGH_PCT,
    HOST_SYNC_MEDIUM_PCT,
    HOST_SYNC_MIN_IDLE_PCT,
    LAUNCH_BOUND_SMALL_KERNEL_PCT,
    MEMORY_GROWTH_MIN_MB_PER_STEP,
    MIXED_PRECISION_LOW_PCT,
    MIXED_PRECISION_MEDIUM_PCT,
    PAGEABLE_MEMCPY_MEDIUM_PCT,
)
from lightning_perf.analysis.summary import Finding, Settings
from lightning_perf.analysis.trace_figures import TraceFigures
from lightning_perf.errors import ConfigError


def _bound(figures: TraceFigures) -> bool:
    return input_bound_verdict(figures.dataloader_pct) in VERDICTS[:2]


# said of a trace without a backward pass or optimizer step
_NOT_TRAINING = (
    " The trace has no backward pass and no optimizer step: a forward-only run (serving, evaluation), not "
    "training."
)


def input_bound(figures: TraceFigures, training: bool = True) -> Finding | None:
    """The DataLoader share of the traced steps, graded as the summary's rule; silent below the moderate line."""
    verdict = input_bound_verdict(figures.dataloader_pct)
    if verdict not in VERDICTS[:2]:
        return None
    return Finding(
        id="input_bound",
        severity="high" if verdict == VERDICTS[0] else "medium",
        title=f"{'Training' if training else 'The run'} is {verdict}",
        verdict=verdict,
        evidence=f"The DataLoader takes {_fmt(figures.dataloader_pct)}% of the {figures.steps} traced steps "
        f"(mean step {_fmt(figures.step_ms)} ms)." + ("" if training else _NOT_TRAINING),
        recommendation=f"Raise `num_workers` in the {'training ' if training else ''}DataLoader (with "
        "`persistent_workers=True`), or make per-sample loading cheaper.",
    )


def gpu_idle(figures: TraceFigures) -> Finding | None:
    idle = figures.step_idle_pct
    if idle is None or idle < GPU_IDLE_MEDIUM_PCT or _bound(figures):
        return None
    where = sorted(figures.host_during_idle_pct.items(), key=lambda kv: kv[1], reverse=True)
    host = ", ".join(f"{name} {_fmt(share)}%" for name, share in where[:3] if share > 0)
    return Finding(
        id="gpu_idle",
        severity="high" if idle >= GPU_IDLE_HIGH_PCT else "medium",
        title="The GPU is idle a large share of the step",
        evidence=f"No kernel or copy runs during {_fmt(idle)}% of the traced steps while the DataLoader takes "
        f"{_fmt(figures.dataloader_pct or 0.0)}%"
        + (f"; meanwhile the host was in: {host}." if host else "."),
        recommendation="Keep the GPU fed: a larger batch, fewer host-side Python operations and syncs per "
        "step, and `torch.compile` to cut per-operator host overhead.",
    )


def host_sync(figures: TraceFigures) -> Finding | None:
    share = figures.blocking_pct
    if share is None or share < HOST_SYNC_MEDIUM_PCT or not figures.blocking:
        return None
    # while the GPU stays busy the wait costs little (the host is only held back from running ahead)
    starving = figures.step_idle_pct is not None and figures.step_idle_pct >= HOST_SYNC_MIN_IDLE_PCT
    top = figures.blocking[0]
    return Finding(
        id="host_sync",
        severity=("high" if share >= HOST_SYNC_HIGH_PCT else "medium") if starving else "low",
        title=f"The host waits for the GPU in {top.name}",
        evidence=f"Blocking calls hold the host {_fmt(figures.blocking_ms_per_step)} ms a step "
        f"({_fmt(share)}% of it, GPU idle {_fmt(figures.step_idle_pct)}%); the largest: {top.name} from "
        f"{top.operator}, {top.calls} calls, {_fmt(top.ms_per_step)} ms a step.",
        recommendation="Remove per-step `.item()`, `.cpu()` and printing of tensors, log with `on_step=False` "
        "(or less often), and copy with `non_blocking=True` from pinned memory.",
    )


def launch_bound(figures: TraceFigures) -> Finding | None:
    launch, kernel = figures.launch_ms_per_step, figures.kernel_ms_per_step
    small, idle = figures.small_kernel_count_pct, figures.step_idle_pct
    if launch is None or kernel is None or small is None or idle is None:
        return None
    if launch <= kernel or small < LAUNCH_BOUND_SMALL_KERNEL_PCT or idle < GPU_IDLE_MEDIUM_PCT:
        return None
    return Finding(
        id="launch_bound",
        severity="medium",
        title="Kernel launches cost more than the kernels run",
        evidence=f"{_fmt(figures.launches_per_step)} launches a step take {_fmt(launch)} ms of host time for "
        f"{_fmt(kernel)} ms of kernels; {_fmt(small)}% of kernels run under 10 us (median "
        f"{_fmt(figures.kernel_median_us)} us); GPU idle {_fmt(idle)}%.",
        recommendation="Fuse the small operations: `torch.compile(model)` (or CUDA graphs), a fused/foreach "
        "optimizer (`foreach=True`, `fused=True`), or a larger batch.",
    )


def pageable_memcpy(figures: TraceFigures, training: bool = True) -> Finding | None:
    if figures.pageable_htod_calls <= 0:
        return None
    share = figures.pct_of_step(figures.pageable_htod_ms_per_step) or 0.0
    return Finding(
        id="pageable_memcpy",
        severity="medium" if share >= PAGEABLE_MEMCPY_MEDIUM_PCT else "low",
        title="Host-to-device copies come from pageable memory",
        evidence=f"{figures.pageable_htod_calls} HtoD copies from pageable memory take "
        f"{_fmt(figures.pageable_htod_ms_per_step)} ms a step ({_fmt(share)}%); such copies block the host "
        "and cannot overlap compute.",
        recommendation=f"Set `pin_memory=True` in the {'training ' if training else ''}DataLoader (Lightning "
        "then copies batches with `non_blocking=True`).",
        settings_change={"pin_memory": True},
    )


def mixed_precision(figures: TraceFigures, settings: Settings | None = None) -> Finding | None:
    """Eligible matmul and convolution time without matrix cores, decided by the precision the operators computed
    in (:mod:`~lightning_perf.analysis.matrix_cores`: input types, else the run's ``settings``, else kernel
    names). No precision advice to work already in half precision; none to a GPU without tensor cores."""
    cc, device = figures.compute_capability, figures.device_name
    share: float | None
    if figures.tc_eligible_by:
        split = matrix_core_split(figures.tc_eligible_by, cc, device, settings)
        share, reasons = split.without_pct, split.reasons()
        dtypes = sorted(split.without_by_dtype, key=lambda d: -split.without_by_dtype[d])
    else:  # figures made before the precision split: the kernel names decided
        share, reasons, dtypes = figures.tc_eligible_without_tc_pct, [BY_NAMES], []
    if share is None or share < MIXED_PRECISION_LOW_PCT:
        return None
    on = (figures.device_name or "the GPU") + (f" (compute capability {cc[0]}.{cc[1]})" if cc else "")
    matrix = figures.tensor_core_pct
    if matrix is not None and figures.tc_eligible_without_tc_pct is not None:  # as the settings decided
        matrix += figures.tc_eligible_without_tc_pct - share
    evidence = (
        f"{_fmt(share)}% of kernel time is in tensor-core-eligible operators (convolution, matmul, linear, ...) "
        f"running without tensor cores{_why(figures, reasons, dtypes, settings)}; matrix-core work: "
        f"{_fmt(matrix)}% of kernel time on {on}."
    )
    if has_matrix_cores("fp16", cc, device) is False:
        start = (
            "AMD's come with CDNA (MI100 and later) and RDNA3 (WMMA)"
            if is_amd(device)
            else f"tensor cores start at compute capability {TENSOR_CORE_MIN_CC}.0"
        )
        return Finding(
            id="mixed_precision",
            severity="info",
            title="Matmuls and convolutions run without tensor cores: the GPU has none",
            evidence=evidence,
            recommendation=f"No precision setting moves this work onto matrix cores on {on}: {start}. Mixed "
            "precision would still halve activation memory and traffic.",
        )
    target = "bf16-mixed" if has_matrix_cores("bf16", cc, device) else "16-mixed"
    moves = f": the {_fmt(share)}% of kernel time in that work would run on tensor cores"
    if dtypes and dtypes[0] == "bf16" and target == "16-mixed":
        moves = f": {on} has tensor cores for fp16, not bf16 (from compute capability {BF16_MIN_CC}.0)"
    return Finding(
        id="mixed_precision",
        severity="medium" if share >= MIXED_PRECISION_MEDIUM_PCT else "low",
        title="Matmuls and convolutions run without tensor cores",
        evidence=evidence,
        recommendation=f'Set `Trainer(precision="{target}")`{moves}'
        + (
            ', and `torch.set_float32_matmul_precision("high")` for what stays in float32.'
            if target == "bf16-mixed"
            else "."
        ),
        settings_change={"precision": target},
    )


def half_by_types(eligible_by: Mapping[str, Sequence[float]] | None) -> bool | None:
    """Whether most of a trace's eligible work (its ``tc_eligible_by``) computes in half precision by the
    operators' input types; None when the trace has no typed eligible work."""
    typed = {k: v[0] for k, v in (eligible_by or {}).items() if k.partition("/")[2] != UNKNOWN}
    if not typed:
        return None
    half = sum(pct for key, pct in typed.items() if key.partition("/")[2] in HALF_DTYPES)
    return half > sum(typed.values()) / 2


def types_say_half(
    settings: Settings | None, eligible_by: Iterable[Mapping[str, Sequence[float]] | None]
) -> bool:
    """Whether settings that read full precision (autocast by hand, a model cast to bf16 under
    ``precision="32-true"``) hide eligible work that the traces' input types show in half precision."""
    precision = getattr(settings, "precision", None)
    if precision is not None and str(precision) not in FULL_PRECISION:
        return False
    known = [half for half in map(half_by_types, eligible_by) if half is not None]
    return bool(known) and all(known)


def settings_advice_superseded(traces: Sequence[TraceFigures], settings: Settings | None) -> bool:
    """Whether the run summary's precision advice, made from its settings alone, is wrong by the traces: their
    input types show the work in half precision (:func:`types_say_half`) and none gets precision advice."""
    return types_say_half(settings, (f.tc_eligible_by for f in traces)) and not any(
        mixed_precision(f, settings) for f in traces
    )


def _why(figures: TraceFigures, reasons: list[str], dtypes: list[str], settings: Settings | None) -> str:
    """Why the work counts as without tensor cores, in the evidence's words: what decided it and how."""
    if not reasons or reasons[0] == BY_NAMES:
        if dtypes and dtypes[0] == "fp32":  # typed fp32, TF32 unknown
            return " by their kernel names (they compute in fp32, from the operators' input types; whether TF32 was on is not known without the run summary)"
        return " by their kernel names (the trace has no input types, and the run's precision is not known)"
    source = (
        f"precision={settings.precision} in the run summary; the trace has no input types"
        if reasons[0] == BY_PRECISION and settings is not None
        else "the operators' input types"
    )
    why = f": they compute in {'/'.join(d for d in dtypes if d != UNKNOWN) or 'fp32'} ({source})"
    if "fp32" not in dtypes:
        return why
    if has_matrix_cores("tf32", figures.compute_capability, figures.device_name) is False:
        return why + f", and {figures.device_name or 'the GPU'} has no TF32"
    if settings is not None:
        return (
            why + f", TF32 off (float32_matmul_precision={settings.float32_matmul_precision or 'highest'!r})"
        )
    return why


def exposed_communication(figures: TraceFigures, training: bool = True) -> Finding | None:
    share = figures.exposed_communication_pct
    if share is None or share < EXPOSED_COMM_MEDIUM_PCT:
        return None
    return Finding(
        id="exposed_communication",
        severity="high" if share >= EXPOSED_COMM_HIGH_PCT else "medium",
        title="Communication is not hidden behind compute",
        evidence=f"Communication kernels run {_fmt(figures.communication_ms_per_step)} ms a step; "
        f"{_fmt(figures.exposed_communication_ms_per_step)} ms of it ({_fmt(share)}% of the step) overlaps no "
        "compute kernel.",
        recommendation="Use `DDPStrategy(bucket_cap_mb=..., gradient_as_bucket_view=True, static_graph=True, "
        "find_unused_parameters=False)` so gradients are reduced while the backward pass runs."
        if training
        else "Overlap the collectives with compute (issue them asynchronously and wait for them as late as "
        "possible) or exchange less a step (fewer, larger collectives; a smaller tensor-parallel group).",
    )


def memory_growth(figures: TraceFigures, training: bool = True) -> Finding | None:
    found = _memory_growth(figures)
    if found is None or training:
        return found
    fixes = {
        "GPU memory grows step after step": "Keep no outputs on the GPU across steps: run under "
        "`torch.inference_mode()` and move what you keep off the GPU (`.cpu()`) or drop it each step.",
        "Peak GPU memory is near the device's capacity": 'Leave headroom: `precision="bf16-mixed"` (or '
        "`torch.autocast`), `torch.inference_mode()`, or a smaller batch.",
        "GPU memory has room for a larger batch": "A larger batch would use the free memory.",
    }
    return dataclasses.replace(found, recommendation=fixes.get(found.title, found.recommendation))


def _memory_growth(figures: TraceFigures) -> Finding | None:
    growth, capacity, peak = (
        figures.memory_growth_mb_per_step,
        figures.memory_capacity_gb,
        figures.memory_peak_gb,
    )
    if (
        growth is not None
        and growth >= MEMORY_GROWTH_MIN_MB_PER_STEP
        and (figures.memory_growth_steps >= figures.steps - 2)
    ):
        eta = ""
        if capacity and peak is not None and figures.memory_absolute:
            eta = f"; at this rate the {_fmt(capacity)} GB device is full in ~{(capacity - peak) * MB_PER_GB / growth:.0f} steps"
        return Finding(
            id="memory_growth",
            severity="high",
            title="GPU memory grows step after step",
            evidence=f"Allocated memory rises {_fmt(growth)} MB a step ({figures.memory_growth_steps} of "
            f"{figures.steps - 1} steps up){eta}.",
            recommendation=LEAK_RECOMMENDATION + ".",
        )
    if not figures.memory_absolute:  # changes only: the peak is relative to the first sample
        return None
    return capacity_finding(peak, capacity)


TRACE_RULES = (
    input_bound,
    gpu_idle,
    host_sync,
    launch_bound,
    pageable_memcpy,
    mixed_precision,
    exposed_communication,
    memory_growth,
)


# the rules whose words depend on whether the trace is of training (see the module doc)
WORDED_BY_KIND = (input_bound, pageable_memcpy, exposed_communication, memory_growth)


# the rules that read the run's settings where there is a summary (the precision the trace does not record)
READ_SETTINGS = (mixed_precision,)


def diagnose_trace(
    figures: TraceFigures, training: bool = True, settings: Settings | None = None
) -> list[Finding]:
    """All trace findings for one trace's figures, most severe first (rule order within one severity).
    ``training``: whether the trace shows a backward pass or optimizer step (the words of the findings);
    ``settings``: the run summary's, when there is one (precision and TF32, for traces without input types)."""
    if not isinstance(figures, TraceFigures):
        raise ConfigError(f"figures: expected TraceFigures, got {type(figures).__name__}")
    found = (
        rule(figures, training=training)
        if rule in WORDED_BY_KIND
        else rule(figures, settings)
        if rule in READ_SETTINGS
        else rule(figures)
        for rule in TRACE_RULES
    )
    findings = [f for f in found if f is not None]
    return sorted(findings, key=lambda f: SEVERITY_ORDER.index(f.severity))
