"""Helpers the diagnosis rules share: reading a summary's settings and shaping evidence."""

from __future__ import annotations

import math
from typing import Any

from lightning_perf.analysis.numbers import finite as _num
from lightning_perf.analysis.numbers import fmt1 as _fmt
from lightning_perf.analysis.numbers import whole
from lightning_perf.analysis.rules.thresholds import CUDA_ACCELERATORS, OVERHEAD_SHARE_PCT, WORKERS_MARGIN
from lightning_perf.analysis.summary import RunSummary


def medians(summary: RunSummary) -> str:
    step, wait = summary.timing.step_time_ms, summary.timing.data_wait_ms
    if step is None or wait is None:
        return ""
    return f" (median step {_fmt(step.median)} ms, median wait {_fmt(wait.median)} ms)"


def others(count: int) -> str:
    return "the other rank" if count == 1 else f"the other {count} ranks"


def on_cuda(summary: RunSummary) -> bool:
    accelerator = summary.settings.accelerator
    return isinstance(accelerator, str) and accelerator.lower() in CUDA_ACCELERATORS


def usable_cores(summary: RunSummary) -> int | None:
    cpu = summary.utilization.cpu
    return summary.settings.cpu_count or (cpu.cpu_count if cpu else None) or None


def lightning_worker_bound(cores: int, local_ranks: int) -> int:
    # Lightning's suggested_max_num_workers: a share of the cores per local process, one left for the process
    return max(1, cores // local_ranks - 1)


def share_pct(part_s: float | None, whole_s: float | None) -> float | None:
    part, whole = _num(part_s), _num(whole_s)
    if part is None or whole is None or whole <= 0 or part <= 0:
        return None  # 0.0 is the "not measured" default of these fields
    return 100.0 * part / whole


def every_n(part_s: float, whole_s: float) -> int:
    """How much rarer the overhead must run to drop below OVERHEAD_SHARE_PCT of the wall time (at least 2)."""
    rest, line = max(whole_s - part_s, 1e-9), OVERHEAD_SHARE_PCT / 100.0
    # part/n / (rest + part/n) < line  <=>  n > part * (1 - line) / (line * rest)
    return max(2, math.floor(part_s * (1 - line) / (line * rest)) + 1)


def probe_value(probe: Any, name: str) -> Any:
    # the probe is a NumWorkersProbe in memory and a plain dict after a JSON round trip
    return probe.get(name) if isinstance(probe, dict) else getattr(probe, name, None)


def suggest_workers(summary: RunSummary) -> tuple[int | None, str]:
    """(num_workers, why) for an input-bound run: ``(None, why)`` when more workers cannot help,
    ``(None, "")`` when there is not enough data to say."""
    current = summary.settings.num_workers
    probe = summary.probes.get("num_workers")
    suggested = probe_value(probe, "suggested") if probe is not None else None
    if whole(suggested) is not None:
        reason = probe_value(probe, "reason") or "no reason recorded"
        if current is not None and suggested <= current:
            return None, f"the num_workers probe found nothing faster than {current}: {reason}"
        return suggested, f"measured by the num_workers probe: {reason}"
    n_cores = usable_cores(summary)
    bound = lightning_worker_bound(n_cores, max(summary.settings.devices or 1, 1)) if n_cores else None
    estimate = estimate_workers(summary)
    if estimate is not None:
        target, why = estimate
    elif current is not None:
        target, why = max(2, current * 2), "heuristic: twice the current workers"
    elif bound is not None:
        return bound, f"heuristic: Lightning's bound for {n_cores} cores"
    else:
        return None, ""
    if bound is not None and target > bound:
        target, why = bound, why + f", capped at {bound} for {n_cores} cores"
    if current is not None and target <= current:
        return None, f"{current} workers already use the {n_cores} usable cores"
    return target, why


def estimate_workers(summary: RunSummary) -> tuple[int, str] | None:
    """Workers needed to load one batch per compute time, from the measured medians.

    With 0 workers the wait is the whole load time of a batch. With n workers that keep the loop waiting,
    they deliver one batch per step, so one worker needs about n * step to load a batch.
    """
    timing, current = summary.timing, summary.settings.num_workers
    step, wait = timing.step_time_ms, timing.data_wait_ms
    if current is None or step is None or wait is None:
        return None
    compute = timing.compute_ms.median if timing.compute_ms is not None else step.median - wait.median
    if timing.gpu_compute_ms is not None:  # the GPU's own time per step: host compute is understated when
        compute = timing.gpu_compute_ms.median  # the host runs ahead of queued kernels
    if compute <= 0:
        return None
    load_ms = wait.median if current == 0 else current * step.median
    target = max(1, math.ceil(WORKERS_MARGIN * load_ms / compute))
    return target, (
        f"estimated: a batch takes ~{_fmt(load_ms)} ms to load and {_fmt(compute)} ms to compute, "
        f"with a {WORKERS_MARGIN}x margin"
    )


def change_text(change: dict[str, Any]) -> str:
    """A settings change as the user writes it: `num_workers=4`, `pin_memory=True`."""
    return ", ".join(f"`{k}={v!r}`" for k, v in change.items())
