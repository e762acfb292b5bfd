"""Diagnosis: pure rules that turn a :class:`RunSummary` into :class:`Finding` s.

Every rule reads only the summary, states its evidence with the measured numbers, recommends one change
in one sentence and gives that change as data (``Finding.settings_change``) so a later step can try it.
A rule whose evidence is absent (``None``) stays silent: it never guesses with zeros. When timing data
exists the input-bound verdict is always reported, even when it is "not input-bound".

The findings are rendered for people by :mod:`lightning_perf.analysis.findings_render`. This module imports nothing
from Lightning or torch.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from lightning_perf.analysis.summary import Finding, RunSummary

# TensorFlow Profiler's input-pipeline analyzer (op_stats_to_input_pipeline_analysis.cc,
# kHighlyInfeedBoundThresholdInPercent / kModeratelyInfeedBoundThresholdInPercent): share of step time
# waiting on input. torch-tb-profiler's single DataLoader rule also fired above 5%.
INPUT_BOUND_HIGH_PCT = 20.0
INPUT_BOUND_MODERATE_PCT = 5.0
# Worker start-up (first fetch of an epoch) above this share of the epoch is worth persistent workers.
# Our choice: the same 5% TensorFlow uses for "moderately" input-bound, i.e. the point a cost is visible.
EPOCH_START_SHARE_PCT = 5.0
# NVML utilization is the share of time any kernel runs; below half the GPU idles most of the time.
# Our choice (NVIDIA's DCGM guidance treats sustained low utilization as under-use; 50% is the brief's line).
LOW_GPU_UTIL_PCT = 50.0
# Tensor cores: Volta (compute capability 7.0) onwards; bfloat16 needs Ampere (8.0) (CUDA programming guide).
TENSOR_CORE_MIN_CC = 7
BF16_MIN_CC = 8
# Validation or checkpointing above this share of training wall time. Our choice: a tenth of the wall
# time, twice TensorFlow's 5% "visible" line, since validation is useful work, not pure overhead.
OVERHEAD_SHARE_PCT = 10.0
# A worker process busy this share of one core all run long has no slack (psutil: 100 = one core).
# Our choice: "close to 100%" leaving room for sampling noise.
WORKER_SATURATED_PCT = 90.0
# A rank whose step time or data wait exceeds the median of the other ranks by this ratio and gap.
# Our choice: 20% is beyond run-to-run noise of step medians; the gap ignores sub-ms jitter on tiny steps.
STRAGGLER_RATIO = 1.2
STRAGGLER_MIN_GAP_MS = 2.0
# Safety margin when estimating num_workers from the measured wait (the probe uses the same margin).
WORKERS_MARGIN = 1.2

SEVERITY_ORDER = ("high", "medium", "low", "info")
VERDICTS = ("highly input-bound", "moderately input-bound", "not input-bound")
FULL_PRECISION = ("32-true", "32")
CUDA_ACCELERATORS = ("cuda", "gpu")
# Where each key of ``Finding.settings_change`` applies, for whoever applies the change.
SETTING_TARGETS = {
    "num_workers": "DataLoader",
    "pin_memory": "DataLoader",
    "persistent_workers": "DataLoader",
    "prefetch_factor": "DataLoader",
    "batch_size": "DataLoader",
    "benchmark": "Trainer",
    "precision": "Trainer",
    "check_val_every_n_epoch": "Trainer",
    "every_n_epochs": "ModelCheckpoint",
}


def diagnose(summary: RunSummary) -> list[Finding]:
    """All findings for ``summary``, most severe first (rule order within one severity)."""
    if not isinstance(summary, RunSummary):
        raise ValueError(f"summary: expected a RunSummary, got {type(summary).__name__}")
    verdict = input_bound_verdict(summary.timing.data_wait_pct)
    findings: list[Finding] = []
    for rule in (
        _input_bound,
        _pin_memory,
        _persistent_workers,
        _prefetch_factor,
        _cudnn_benchmark,
        _low_gpu_util,
        _mixed_precision,
        _validation_share,
        _checkpoint_share,
        _workers_exceed_cores,
        _workers_saturated,
        _straggler,
    ):
        finding = rule(summary, verdict)
        if finding is not None:
            findings.append(finding)
    return sorted(findings, key=lambda f: SEVERITY_ORDER.index(f.severity))


def input_bound_verdict(data_wait_pct: float | None) -> str | None:
    """TensorFlow's grade for a data-wait share in percent; ``None`` when the share was not measured."""
    pct = _num(data_wait_pct)
    if pct is None:
        return None
    if pct >= INPUT_BOUND_HIGH_PCT:
        return VERDICTS[0]
    if pct >= INPUT_BOUND_MODERATE_PCT:
        return VERDICTS[1]
    return VERDICTS[2]


# --- rules: each (summary, verdict) -> Finding | None ---------------------------------------------------


def _input_bound(summary: RunSummary, verdict: str | None) -> Finding | None:
    if verdict is None:
        return None
    timing = summary.timing
    evidence = f"DataLoader wait is {_fmt(timing.data_wait_pct)}% of step time" + _medians(summary)
    if verdict == VERDICTS[2]:
        return Finding(
            id="input_bound",
            severity="info",
            title="Training is not input-bound",
            evidence=evidence + f" (below the {_fmt(INPUT_BOUND_MODERATE_PCT)}% line).",
            recommendation="The DataLoader keeps up; look at compute, not the input pipeline.",
        )
    severity = "high" if verdict == VERDICTS[0] else "medium"
    workers, why = _suggest_workers(summary)
    change = {} if workers is None else {"num_workers": workers}
    if workers is not None:
        recommendation = f"Set `num_workers={workers}` in the training DataLoader ({why})."
    elif why:
        recommendation = (
            f"More workers will not help ({why}): make the per-sample work cheaper (decode, transforms, "
            "storage) or give the job more CPU cores."
        )
    else:
        recommendation = "Raise `num_workers` in the training DataLoader (current value and cores unknown)."
    return Finding("input_bound", severity, f"Training is {verdict}", evidence + ".", recommendation, change)


def _pin_memory(summary: RunSummary, verdict: str | None) -> Finding | None:
    settings = summary.settings
    if not _on_cuda(summary) or settings.pin_memory is not False:
        return None
    # pageable host memory makes the host-to-device copy synchronous and slower; worth most when input-bound
    severity = "medium" if verdict in VERDICTS[:2] else "low"
    return Finding(
        id="pin_memory",
        severity=severity,
        title="pin_memory is off while training on CUDA",
        evidence=f"DataLoader pin_memory=False with accelerator={settings.accelerator!r}"
        + (f" and {verdict} (data wait {_fmt(summary.timing.data_wait_pct)}%)." if verdict else "."),
        recommendation="Set `pin_memory=True` so batches are copied to the GPU from page-locked memory.",
        settings_change={"pin_memory": True},
    )


def _persistent_workers(summary: RunSummary, verdict: str | None) -> Finding | None:
    timing, settings = summary.timing, summary.settings
    if not settings.num_workers or settings.persistent_workers is not False:
        return None
    start, step = timing.epoch_start_ms, timing.step_time_ms
    if start is None or step is None or timing.epochs <= 0 or timing.steps <= 0:
        return None
    # epoch time estimated as its steps at the median step time plus the start-up itself
    epoch_ms = timing.steps / timing.epochs * step.median + start.median
    share = 100.0 * start.median / epoch_ms if epoch_ms > 0 else None
    if share is None or share < EPOCH_START_SHARE_PCT:
        return None
    return Finding(
        id="persistent_workers",
        severity="medium",
        title="DataLoader workers restart every epoch",
        evidence=f"Epoch start-up (first fetch) takes {_fmt(start.median)} ms, {_fmt(share)}% of an epoch "
        f"(~{_fmt(epoch_ms)} ms: {_fmt(timing.steps / timing.epochs)} steps at median "
        f"{_fmt(step.median)} ms), "
        f"with {settings.num_workers} workers and persistent_workers=False.",
        recommendation="Set `persistent_workers=True` so workers survive between epochs.",
        settings_change={"persistent_workers": True},
    )


def _prefetch_factor(summary: RunSummary, verdict: str | None) -> Finding | None:
    workers = summary.settings.num_workers
    if verdict not in VERDICTS[:2] or not workers:
        return None
    current = summary.settings.prefetch_factor
    factor = current if current else 2  # torch's default when num_workers > 0
    return Finding(
        id="prefetch_factor",
        severity="low",
        title="Workers may not prefetch far enough ahead",
        evidence=f"Still {verdict} (data wait {_fmt(summary.timing.data_wait_pct)}%) with {workers} workers "
        f"and prefetch_factor={factor} ({workers * factor} batches in flight).",
        recommendation=f"Raise `prefetch_factor` to {factor * 2} to absorb uneven batch loading times.",
        settings_change={"prefetch_factor": factor * 2},
    )


def _cudnn_benchmark(summary: RunSummary, verdict: str | None) -> Finding | None:
    settings = summary.settings
    if not _on_cuda(summary) or settings.cudnn_benchmark is not False or settings.model_has_conv is not True:
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


def _low_gpu_util(summary: RunSummary, verdict: str | None) -> Finding | None:
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


def _mixed_precision(summary: RunSummary, verdict: str | None) -> Finding | None:
    settings, gpu = summary.settings, summary.utilization.gpu
    cc = gpu.compute_capability if gpu else None
    if not _on_cuda(summary) or not cc or not isinstance(cc[0], int) or cc[0] < TENSOR_CORE_MIN_CC:
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


def _validation_share(summary: RunSummary, verdict: str | None) -> Finding | None:
    timing = summary.timing
    share = _share(timing.validation_s, timing.train_wall_s)
    if share is None or share < OVERHEAD_SHARE_PCT:
        return None
    every = _every_n(timing.validation_s, timing.train_wall_s)
    return Finding(
        id="validation_share",
        severity="medium",
        title="Validation takes a large share of training time",
        evidence=f"Validation took {_fmt(timing.validation_s)} s of {_fmt(timing.train_wall_s)} s "
        f"training wall time ({_fmt(share)}%, line {_fmt(OVERHEAD_SHARE_PCT)}%).",
        recommendation=f"Validate less often (`check_val_every_n_epoch={every}`, a larger "
        "`val_check_interval`) or on fewer batches (`limit_val_batches`).",
        settings_change={"check_val_every_n_epoch": every},
    )


def _checkpoint_share(summary: RunSummary, verdict: str | None) -> Finding | None:
    timing = summary.timing
    share = _share(timing.checkpoint_s, timing.train_wall_s)
    if share is None or share < OVERHEAD_SHARE_PCT:
        return None
    every = _every_n(timing.checkpoint_s, timing.train_wall_s)
    return Finding(
        id="checkpoint_share",
        severity="medium",
        title="Checkpointing takes a large share of training time",
        evidence=f"Saving checkpoints took {_fmt(timing.checkpoint_s)} s of {_fmt(timing.train_wall_s)} s "
        f"training wall time ({_fmt(share)}%, line {_fmt(OVERHEAD_SHARE_PCT)}%).",
        recommendation=f"Save less often (`ModelCheckpoint(every_n_epochs={every})`), keep fewer "
        "(`save_top_k`) or write to faster storage.",
        settings_change={"every_n_epochs": every},
    )


def _workers_exceed_cores(summary: RunSummary, verdict: str | None) -> Finding | None:
    workers, cores = summary.settings.num_workers, _cores(summary)
    if not workers or not cores:
        return None
    local_ranks = max(summary.settings.devices or 1, 1)
    if workers * local_ranks <= cores:
        return None
    bound = _lightning_worker_bound(cores, local_ranks)
    per_host = f"{workers} workers x {local_ranks} processes" if local_ranks > 1 else f"{workers} workers"
    return Finding(
        id="workers_exceed_cores",
        severity="medium",
        title="More DataLoader workers than CPU cores",
        evidence=f"{per_host} = {workers * local_ranks} worker processes on {cores} usable cores.",
        recommendation=f"Set `num_workers={bound}`: extra workers only compete for the same cores.",
        settings_change={"num_workers": bound},
    )


def _workers_saturated(summary: RunSummary, verdict: str | None) -> Finding | None:
    cpu = summary.utilization.cpu
    busy = _num(cpu.workers_cpu_pct) if cpu else None
    workers = (cpu.num_workers_seen if cpu else None) or summary.settings.num_workers
    if busy is None or not workers:
        return None
    per_worker = busy / workers
    if per_worker < WORKER_SATURATED_PCT:
        return None
    bound = verdict in VERDICTS[:2]
    return Finding(
        id="workers_saturated",
        severity="medium" if bound else "low",
        title="The input pipeline is CPU-bound" if bound else "DataLoader workers are busy all the time",
        evidence=f"{workers} workers use {_fmt(busy)}% CPU together, {_fmt(per_worker)}% of a core each "
        f"(line {_fmt(WORKER_SATURATED_PCT)}%)" + (f", and training is {verdict}." if verdict else "."),
        recommendation="Make per-sample transforms cheaper (decode once, move augmentation to the GPU) "
        "or run on more CPU cores.",
    )


def _straggler(summary: RunSummary, verdict: str | None) -> Finding | None:
    if len(summary.ranks) < 2:
        return None
    lines: list[str] = []
    names: list[str] = []
    for stats in summary.ranks:
        for metric, label in (("step_time_ms", "step time"), ("data_wait_ms", "data wait")):
            value = _num(getattr(stats, metric))
            others = [_num(getattr(o, metric)) for o in summary.ranks if o is not stats]
            others_known = [v for v in others if v is not None]
            if value is None or not others_known:
                continue
            median = statistics.median(others_known)
            if value > STRAGGLER_RATIO * median and value - median >= STRAGGLER_MIN_GAP_MS:
                ratio = f"{value / median:.2f}x" if median > 0 else "above zero"
                lines.append(
                    f"rank {stats.rank} on {stats.host}: {label} {_fmt(value)} ms vs {_fmt(median)} ms "
                    f"median of {_others(len(others_known))} ({ratio})"
                )
                name = f"rank {stats.rank} ({stats.host})"
                if name not in names:
                    names.append(name)
    if not lines:
        return None
    return Finding(
        id="straggler",
        severity="medium",
        title="Straggler: " + ", ".join(names),
        evidence="; ".join(lines) + ". Every rank waits for the slowest one at each gradient all-reduce.",
        recommendation="Check that host for CPU contention, slower storage or fewer cores per DataLoader, "
        "and for a throttled or shared GPU.",
    )


# --- helpers --------------------------------------------------------------------------------------------


def _num(value: Any) -> float | None:
    """A finite number, or ``None`` for anything absent or not measurable."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _medians(summary: RunSummary) -> str:
    step, wait = summary.timing.step_time_ms, summary.timing.data_wait_ms
    if step is None or wait is None:
        return ""
    return f" (median step {_fmt(step.median)} ms, median wait {_fmt(wait.median)} ms)"


def _others(count: int) -> str:
    return "the other rank" if count == 1 else f"the other {count} ranks"


def _on_cuda(summary: RunSummary) -> bool:
    accelerator = summary.settings.accelerator
    return isinstance(accelerator, str) and accelerator.lower() in CUDA_ACCELERATORS


def _cores(summary: RunSummary) -> int | None:
    cpu = summary.utilization.cpu
    return summary.settings.cpu_count or (cpu.cpu_count if cpu else None) or None


def _lightning_worker_bound(cores: int, local_ranks: int) -> int:
    # Lightning's suggested_max_num_workers: a share of the cores per local process, one left for the process
    return max(1, cores // local_ranks - 1)


def _share(part_s: float | None, whole_s: float | None) -> float | None:
    part, whole = _num(part_s), _num(whole_s)
    if part is None or whole is None or whole <= 0 or part <= 0:
        return None  # 0.0 is the "not measured" default of these fields
    return 100.0 * part / whole


def _every_n(part_s: float, whole_s: float) -> int:
    """How much rarer the overhead must run to drop below OVERHEAD_SHARE_PCT of the wall time (at least 2)."""
    rest, line = max(whole_s - part_s, 1e-9), OVERHEAD_SHARE_PCT / 100.0
    # part/n / (rest + part/n) < line  <=>  n > part * (1 - line) / (line * rest)
    return max(2, math.floor(part_s * (1 - line) / (line * rest)) + 1)


def _probe_value(probe: Any, name: str) -> Any:
    # the probe is a NumWorkersProbe in memory and a plain dict after a JSON round trip
    return probe.get(name) if isinstance(probe, dict) else getattr(probe, name, None)


def _suggest_workers(summary: RunSummary) -> tuple[int | None, str]:
    """(num_workers, why) for an input-bound run: ``(None, why)`` when more workers cannot help,
    ``(None, "")`` when there is not enough data to say."""
    current = summary.settings.num_workers
    probe = summary.probes.get("num_workers")
    suggested = _probe_value(probe, "suggested") if probe is not None else None
    if isinstance(suggested, int) and not isinstance(suggested, bool):
        reason = _probe_value(probe, "reason") or "no reason recorded"
        if current is not None and suggested <= current:
            return None, f"the num_workers probe found nothing faster than {current}: {reason}"
        return suggested, f"measured by the num_workers probe: {reason}"
    cores = _cores(summary)
    bound = _lightning_worker_bound(cores, max(summary.settings.devices or 1, 1)) if cores else None
    estimate = _estimate_workers(summary)
    if estimate is not None:
        target, why = estimate
    elif current is not None:
        target, why = max(2, current * 2), "heuristic: twice the current workers"
    elif bound is not None:
        return bound, f"heuristic: Lightning's bound for {cores} cores"
    else:
        return None, ""
    if bound is not None and target > bound:
        target, why = bound, why + f", capped at {bound} for {cores} cores"
    if current is not None and target <= current:
        return None, f"{current} workers already use the {cores} usable cores"
    return target, why


def _estimate_workers(summary: RunSummary) -> tuple[int, str] | None:
    """Workers needed to load one batch per compute time, from the measured medians.

    With 0 workers the wait is the whole load time of a batch. With n workers that keep the loop waiting,
    they deliver one batch per step, so one worker needs about n * step to load a batch.
    """
    timing, current = summary.timing, summary.settings.num_workers
    step, wait = timing.step_time_ms, timing.data_wait_ms
    if current is None or step is None or wait is None:
        return None
    compute = timing.compute_ms.median if timing.compute_ms is not None else step.median - wait.median
    if compute <= 0:
        return None
    load_ms = wait.median if current == 0 else current * step.median
    target = max(1, math.ceil(WORKERS_MARGIN * load_ms / compute))
    return target, (
        f"estimated: a batch takes ~{_fmt(load_ms)} ms to load and {_fmt(compute)} ms to compute, "
        f"with a {WORKERS_MARGIN}x margin"
    )
