"""Diagnosis rules about the work an input pipeline does per sample, when more workers cannot help.

``input_bound`` recommends workers; :func:`batched_transforms` speaks when workers are no way out: the
num_workers probe measured no gain over the run's own setting, or the training process and its workers
already fill the usable cores; and only when the measured loading computes (its CPU time close to its wall time,
:mod:`lightning_perf.analysis.rules.inputs.loading`) on a machine whose cores others do not hold. The expert fix is then to stop doing per-sample work on the CPU: keep the
samples as uint8 tensors and augment whole batches on the device, in ``LightningModule.on_after_batch_transfer``.
Its settings change is the named recipe ``{"batched_transforms": True}``, for code that knows how to apply it.

Each rule is ``(summary, verdict) -> Finding | None``: silent when its evidence is absent.
"""

from __future__ import annotations

from typing import Any

from lightning_perf.analysis.numbers import finite as _num
from lightning_perf.analysis.numbers import fmt1 as _fmt
from lightning_perf.analysis.rules.helpers import usable_cores
from lightning_perf.analysis.rules.inputs.loading import COMPUTES, loading_of, machine_busy
from lightning_perf.analysis.rules.thresholds import CORES_BUSY_SHARE, PROBE_GAIN_MIN, VERDICTS
from lightning_perf.analysis.summary import Finding, RunSummary

RECIPE = "batched_transforms"


def batched_transforms(summary: RunSummary, verdict: str | None) -> Finding | None:
    if verdict not in VERDICTS[:2]:
        return None
    # "CPU-bound" only when the measured CPU says so: not for a loader that waits, not while others hold the cores
    loading = loading_of(summary)
    if (loading is not None and loading.cause != COMPUTES) or machine_busy(summary) is not None:
        return None
    no_gain = probe_shows_no_gain(summary)
    busy = cores_in_use(summary)
    cores_full = busy is not None and busy[0] >= CORES_BUSY_SHARE * busy[1]
    if no_gain is None and not cores_full:
        return None
    reasons = [] if loading is None else [loading.describe()]
    if no_gain is not None:
        reasons.append(no_gain)
    if busy is not None:
        used, cores = busy
        reasons.append(
            f"the training process and its workers use or wait for {_fmt(used)} of {cores} usable cores "
            f"({_fmt(100.0 * used / cores)}%, line {_fmt(100.0 * CORES_BUSY_SHARE)}%)"
        )
    per_sample = per_sample_ms(summary)
    cost = f", ~{_fmt(per_sample[0])} ms of data work per sample ({per_sample[1]})" if per_sample else ""
    return Finding(
        id=RECIPE,
        severity="high" if verdict == VERDICTS[0] else "medium",
        title="The input pipeline is CPU-bound and more workers cannot fix it",
        evidence=f"DataLoader wait is {_fmt(summary.timing.data_wait_pct)}% of step time{cost}; "
        + "; ".join(reasons)
        + ".",
        recommendation="Keep the samples as uint8 tensors and augment whole batches on the device in "
        "`LightningModule.on_after_batch_transfer` (random crop, flip and normalize as tensor ops on the "
        "batch) instead of per sample in the DataLoader.",
        settings_change={RECIPE: True},
    )


def probe_shows_no_gain(summary: RunSummary) -> str | None:
    """Why the num_workers probe says more workers do not help, or ``None`` (no probe, or it found a gain)."""
    probe = summary.probes.num_workers
    if probe is None or probe.disturbed:  # a probe on a busy machine did not choose
        return None
    current = summary.settings.num_workers or 0
    suggested = probe.suggested
    if suggested is not None and suggested <= current:
        # the probe's own verdict (it stops at the first value that keeps up with the model)
        return f"the num_workers probe found nothing faster than {current}"
    rates = _rates(probe.candidates)
    steps = _predicted_steps(probe.candidates)
    if current in steps and any(n > current for n in steps):
        # the probe's own account of overlap (0 workers pay every load inside the step): compare predicted steps
        more_steps = {n: ms for n, ms in steps.items() if n > current}
        fastest = min(more_steps, key=lambda n: more_steps[n])
        step_gain = steps[current] / more_steps[fastest]
        if step_gain >= PROBE_GAIN_MIN:
            return None
        return (
            f"the num_workers probe predicts at most {step_gain:.2f}x the step of num_workers={current} "
            f"(num_workers={fastest}: {_fmt(more_steps[fastest])} vs {_fmt(steps[current])} ms, with overlap; "
            f"a gain needs {PROBE_GAIN_MIN:g}x)"
        )
    own = rates.get(current)
    more = {n: r for n, r in rates.items() if n > current}
    if own is None or not more:
        return None
    best = max(more, key=lambda n: more[n])
    gain = more[best] / own
    if gain >= PROBE_GAIN_MIN:
        return None
    return (
        f"the num_workers probe measured at most {gain:.2f}x the delivery rate of num_workers={current} "
        f"(num_workers={best}: {_fmt(more[best])} vs {_fmt(own)} batches/s; a gain needs {PROBE_GAIN_MIN:g}x)"
    )


def cores_in_use(summary: RunSummary) -> tuple[float, int] | None:
    """(cores the training process and its workers used or were ready to use, usable cores), or ``None`` when
    not measured. Run-queue time (runnable, waiting for a core) counts: the run's own processes crowding each
    other fill the cores as much as running does."""
    cpu, cores = summary.utilization.cpu, usable_cores(summary)
    process = _num(cpu.process_cpu_pct) if cpu else None
    if cpu is None or process is None or not cores:
        return None
    used = process + (_num(cpu.workers_cpu_pct) or 0.0)
    machine = summary.machine
    queue = _num(machine.train_thread_runqueue_pct) if machine is not None else None
    used += queue or 0.0
    wall, workers_queue, seen = _num(cpu.workers_wall_s), _num(cpu.workers_runqueue_s), cpu.num_workers_seen
    if wall and workers_queue is not None and seen:
        used += 100.0 * workers_queue / (wall / seen)  # the workers' run-queue seconds per second of the run
    return min(used / 100.0, float(cores)), cores


def per_sample_ms(summary: RunSummary) -> tuple[float, str] | None:
    """Data work per sample: from the probe's rate at num_workers=0 (a batch loaded in this process, alone),
    else from the median wait of a run that loaded in its own process; ``None`` when neither was measured."""
    batch = summary.settings.batch_size
    if not batch:
        return None
    probe = summary.probes.num_workers
    rate = _rates(probe.candidates).get(0) if probe is not None else None
    if rate:
        return 1000.0 / rate / batch, f"num_workers probe: {_fmt(rate)} batches/s of {batch} in one process"
    wait = summary.timing.data_wait_ms
    if summary.settings.num_workers == 0 and wait is not None and _num(wait.median):
        return wait.median / batch, f"median wait {_fmt(wait.median)} ms per batch of {batch}, no workers"
    return None


def _predicted_steps(candidates: Any) -> dict[int, float]:
    """num_workers -> the probe's predicted step in ms (compute + the wait overlap leaves), where it gave one."""
    return _by_workers(candidates, "predicted_step_ms")


def _rates(candidates: Any) -> dict[int, float]:
    """num_workers -> measured batches/s of the probe's candidates (failed or unmeasured ones left out)."""
    return _by_workers(candidates, "batches_per_sec")


def _by_workers(candidates: Any, field: str) -> dict[int, float]:
    """num_workers -> the candidates' positive, finite ``field`` (a probe read back from JSON may hold anything)."""
    values: dict[int, float] = {}
    for candidate in candidates if isinstance(candidates, list) else []:
        if not isinstance(candidate, dict):
            continue
        workers, value = candidate.get("num_workers"), _num(candidate.get(field))
        if isinstance(workers, int) and not isinstance(workers, bool) and value is not None and value > 0:
            values[workers] = value
    return values
