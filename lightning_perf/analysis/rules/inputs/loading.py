"""Why a batch is late, measured: the input pipeline's CPU time against its wall time, and the advice that follows.

A batch is late because its loading *waits* (storage, network, a sleep, a lock: CPU time well below wall time),
because it *computes* (decode, augment: CPU time close to wall time), or because *others* hold the cores (the
loading was runnable but waited for a core, and other processes used the machine). Where the loading runs:

* 0 workers: in the training thread's fetch (``TimingSummary.fetch_cpu_ms`` of ``fetch_wall_ms``, sampled, and
  its run-queue time ``fetch_runqueue_ms`` of ``fetch_runqueue_wall_ms``);
* workers: in the worker processes (``CpuUtilization.workers_cpu_s`` and ``workers_runqueue_s`` of
  ``workers_wall_s``, from the OS).

:func:`suggest_workers` turns that into a ``num_workers`` for an input-bound run: waiting loaders get workers past
the core count (they sleep, not compute), computing ones up to the free cores, 0 workers always at least 1 (with
0 workers loading never overlaps the step, however fast the loader), never fewer than the run has. A measured
num_workers probe that was not disturbed gives the count instead of the estimate.

Pure: reads a :class:`RunSummary`, imports nothing from Lightning or torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lightning_perf.analysis.numbers import finite as _num
from lightning_perf.analysis.numbers import fmt1 as _fmt
from lightning_perf.analysis.probe_results import NumWorkersProbe
from lightning_perf.analysis.rules.helpers import lightning_worker_bound, usable_cores
from lightning_perf.analysis.rules.inputs.worker_model import charged_choice
from lightning_perf.analysis.rules.inputs.worker_model import workers_phrase as _workers
from lightning_perf.analysis.rules.thresholds import (
    BUSY_OTHER_CPU_SHARE,
    BUSY_RUNQUEUE_PCT,
    HANDOFF_MAIN_FLOOR_MS,
    LOADING_WAITS_SHARE,
    MIN_FETCHES_SAMPLED,
    NOISY_OTHER_CPU_SHARE,
    WAITING_WORKERS_MAX,
    WORKERS_MARGIN,
)
from lightning_perf.analysis.summary import RunSummary

WAITS = "waits"
COMPUTES = "computes"


@dataclass(frozen=True)
class Loading:
    """Where the loading's wall time went, as shares of it (0-1): on a CPU, waiting for a core, the rest waiting."""

    where: str  # "the training thread's fetches" or "the N DataLoader workers"
    cpu_share: float
    queue_share: float | None  # None: run-queue time not measured (not Linux)
    plural: bool = True

    @property
    def wait_share(self) -> float:
        return max(0.0, 1.0 - self.cpu_share - (self.queue_share or 0.0))

    @property
    def cause(self) -> str:
        return WAITS if self.wait_share >= LOADING_WAITS_SHARE else COMPUTES

    def describe(self) -> str:
        """``the 2 DataLoader workers wait 83% of their time (storage, network, a sleep or a lock) ...``"""
        queue = self.queue_share or 0.0
        waiting_for_core = f", {_fmt(100.0 * queue)}% waiting for a core" if queue >= 0.05 else ""
        wait, compute, their = ("wait", "compute", "their") if self.plural else ("waits", "computes", "its")
        if self.cause == WAITS:
            return (
                f"{self.where} {wait} {_fmt(100.0 * self.wait_share)}% of {their} time (storage, network, a sleep "
                f"or a lock) and {compute} {_fmt(100.0 * self.cpu_share)}%{waiting_for_core}"
            )
        return (
            f"{self.where} {compute} {_fmt(100.0 * self.cpu_share)}% of {their} time{waiting_for_core} and "
            f"{wait} {_fmt(100.0 * self.wait_share)}%"
        )


def loading_of(summary: RunSummary) -> Loading | None:
    """The measured loading of the run's training DataLoader; ``None`` when it was not measured."""
    timing, cpu = summary.timing, summary.utilization.cpu
    workers = summary.settings.num_workers
    if workers is None and cpu is not None:
        workers = cpu.num_workers_seen
    if workers == 0:
        wall, busy = _num(timing.fetch_wall_ms), _num(timing.fetch_cpu_ms)
        if timing.fetches_sampled < MIN_FETCHES_SAMPLED or not wall or busy is None:
            return None
        # the thread's CPU clock ticks coarser than the wall clock on some systems: at most the whole wall
        cpu_share = min(1.0, busy / wall)
        queue_wall, queue = _num(timing.fetch_runqueue_wall_ms), _num(timing.fetch_runqueue_ms)
        queue_share = None
        if timing.fetches_runqueue_sampled and queue_wall and queue is not None:
            # waiting for a core is not waiting on storage: on a busy machine a loading that computes reads so
            queue_share = min(1.0 - cpu_share, queue / queue_wall)
        return Loading("the training thread's fetches", cpu_share, queue_share)
    if not workers or cpu is None:
        return None
    wall, busy, queue = _num(cpu.workers_wall_s), _num(cpu.workers_cpu_s), _num(cpu.workers_runqueue_s)
    if not wall or busy is None:
        return None
    cpu_share = min(1.0, busy / wall)
    queue_share = None if queue is None else min(1.0 - cpu_share, queue / wall)
    if workers == 1:
        return Loading("the DataLoader worker", cpu_share, queue_share, plural=False)
    return Loading(f"the {workers} DataLoader workers", cpu_share, queue_share)


def machine_busy(summary: RunSummary) -> str | None:
    """Evidence that other processes held the cores this run needed, or ``None``.

    Busy counters alone say little of a run's loss: another process on an otherwise idle core costs it nothing.
    So others must have made the training thread wait for a core (``BUSY_RUNQUEUE_PCT`` of the run, Linux
    schedstat), or have used ``BUSY_OTHER_CPU_SHARE`` of all the cores (see thresholds.py for why both).
    """
    machine = summary.machine
    if machine is None:
        return None
    other, cores = _num(machine.other_cores), machine.cpu_count or usable_cores(summary)
    if other is None or not cores or other < NOISY_OTHER_CPU_SHARE * cores:
        return None
    queue = _num(machine.train_thread_runqueue_pct)
    others = f"other processes used {_fmt(other)} of {cores} cores ({_fmt(100.0 * other / cores)}%)"
    if queue is not None and queue >= BUSY_RUNQUEUE_PCT:
        return f"{others}, and the training thread waited for a core {_fmt(queue)}% of the run"
    return others if other >= BUSY_OTHER_CPU_SHARE * cores else None


def waits_beside_others(summary: RunSummary, loading: Loading | None) -> bool:
    """The loading waits (storage, a sleep) even counting as waiting for a core what the others could have taken:
    its own run-queue share where measured, else the training thread's over the whole run (none known: no)."""
    if loading is None:
        return False
    queue = loading.queue_share
    if queue is None and summary.machine is not None:
        run_queue = _num(summary.machine.train_thread_runqueue_pct)
        queue = None if run_queue is None else run_queue / 100.0
    return queue is not None and 1.0 - loading.cpu_share - queue >= LOADING_WAITS_SHARE


def waiting_workers_cap(summary: RunSummary, loading: Loading, cores: int) -> tuple[int, str]:
    """Most workers worth having for a loader that waits, and why: as many as fit in the cores the training process
    leaves free at the CPU share each worker was measured to use, at most ``WAITING_WORKERS_MAX``."""
    cpu = summary.utilization.cpu
    process = _num(cpu.process_cpu_pct) if cpu is not None else None
    free = max(1.0, cores - (process or 0.0) / 100.0)
    fit = math.floor(free / max(loading.cpu_share, 1e-3))
    if fit >= WAITING_WORKERS_MAX:
        return WAITING_WORKERS_MAX, f"capped at {WAITING_WORKERS_MAX}, the most this advice goes to"
    fit = 1 << (max(1, fit).bit_length() - 1)  # down to a power of two, like the target: no flip between runs
    return fit, (
        f"capped at {fit}: at {_fmt(100.0 * loading.cpu_share)}% of a core each, that many fit in the "
        f"{_fmt(free)} free cores"
    )


NOT_MEASURED = "not measured"


@dataclass(frozen=True)
class WorkersAdvice:
    """The num_workers advice for an input-bound run: ``count`` None when no other count is advised, ``why`` the
    reason as shown ("" when there is not enough data to say). ``measured`` False when no count could be measured
    here (a busy machine disturbed it, or the hand-off it turns on was not timed): ``why`` then starts with
    :data:`NOT_MEASURED`, and callers decide on the flag, never on those words."""

    count: int | None
    why: str
    measured: bool = True


def suggest_workers(summary: RunSummary) -> WorkersAdvice:
    """The :class:`WorkersAdvice` for an input-bound run.

    A num_workers probe that measured undisturbed decides, fewer workers or 0 included. Without one, a measured
    hand-off (:mod:`lightning_perf.analysis.rules.inputs.worker_model`) charges every worker count its cost and the count
    with the shortest predicted step is advised, fewer or 0 included. With neither, the old estimate: never fewer
    workers than the run has, from 0 at least 1."""
    by_probe = _by_probe(summary)
    if by_probe is not None:
        return by_probe
    current = summary.settings.num_workers
    loading = loading_of(summary)
    cores = usable_cores(summary)
    held = machine_busy(summary)
    if held is not None and not waits_beside_others(summary, loading):
        # a loading that computes shares the cores the others hold (or was not measured apart from waiting for
        # one): no count measured here holds without them
        why = (
            f"{NOT_MEASURED}: {held}, so a loading that computes cannot be sized here; measure again with the "
            "cores free"
        )
        return WorkersAdvice(None, why, measured=False)
    cap, cap_why = _workers_cap(summary, loading, cores)
    charged = charged_choice(summary, cap)
    if charged is not None:
        pick, why = charged
        if loading is not None and (pick is None or current is None or pick >= current):
            # not where fewer workers are advised: workers that wait on the hand-off queue are not storage
            why = f"{loading.describe()}; {why}"
        return WorkersAdvice(pick, why)
    wait = summary.timing.data_wait_ms
    # beside busy cores the mean fetch is lifted by the fetches that lost their core (an in-memory fetch's median
    # 0.14-0.16 ms against a mean of 5.9-7.6 ms beside four CPU hogs, a CI run told 1 worker from it): there the
    # typical fetch is the median, which a loader that really waits (storage, a sleep) pays on every batch
    typical = None if wait is None else (wait.median if held is not None else wait.mean)
    if current == 0 and typical is not None and typical < HANDOFF_MAIN_FLOOR_MS:
        # no hand-off measured (its probe timed out on a busy machine, or was not run): a worker could not hand
        # a batch over for less than this fetch costs the training thread, so no estimate may add one
        assert wait is not None
        lifted = f" (its median; the mean, {_fmt(wait.mean)} ms, waited for the busy cores)" if held else ""
        why = (
            f"{NOT_MEASURED}: a batch loads in {_fmt(typical)} ms in the training thread{lifted}, less than a "
            f"worker's hand-off of a batch costs it (~{_fmt(HANDOFF_MAIN_FLOOR_MS)} ms or more), and the hand-off "
            "itself was not measured; keep 0 workers"
        )
        return WorkersAdvice(None, why, measured=False)
    return WorkersAdvice(*_estimated(summary, loading, cores, cap, cap_why))


def _workers_cap(summary: RunSummary, loading: Loading | None, cores: int | None) -> tuple[int | None, str]:
    """The most workers worth advising, and why: for a loading that waits as many as the free cores hold at its
    measured CPU share; else Lightning's bound for the cores (none known: no cap)."""
    if loading is not None and loading.cause == WAITS:
        return waiting_workers_cap(summary, loading, cores or 1)
    if cores:
        bound = lightning_worker_bound(cores, max(summary.settings.devices or 1, 1))
        return bound, f"capped at {bound} for {cores} cores"
    return None, ""


def _estimated(
    summary: RunSummary, loading: Loading | None, cores: int | None, cap: int | None, cap_why: str
) -> tuple[int | None, str]:
    """The old estimate, where neither a probe nor a measured hand-off decides: never fewer workers than the run
    has, from 0 at least 1, up to ``cap``."""
    current = summary.settings.num_workers
    local_ranks = max(summary.settings.devices or 1, 1)
    waits = loading is not None and loading.cause == WAITS
    estimate = estimate_workers(summary)
    if estimate is None:
        if current is None:
            if not cores:
                return None, ""
            return lightning_worker_bound(
                cores, local_ranks
            ), f"heuristic: Lightning's bound for {cores} cores"
        target, why = max(1, current * 2), "heuristic: twice the current workers"
    else:
        target, why = estimate
    if waits:
        assert loading is not None and cap is not None
        # up to the probe's ladder (1, 2, 4, 8, ...): a sleeping worker more costs little, and the same run twice
        # must not be told 15 and then 16 because its compute time moved with the machine's load
        target = 1 << (target - 1).bit_length()
        why = f"{loading.describe()}, so workers past the core count overlap it; {why}, rounded up to a power of two"
        enough = f"{_workers(current)} are the most worth having here ({cap_why}; {loading.describe()})"
    else:
        cap = cap if cap is not None else target
        cap_why = cap_why or f"capped at {cap}"
        if loading is not None:
            why = f"{loading.describe()}; {why}"
        enough = (
            f"with {_workers(current)} the training process and its workers fill the {cores} usable cores"
            + (f" ({loading.describe()})" if loading is not None else "")
        )
    if target > cap:
        target, why = cap, f"{why}, {cap_why}"
    if current is not None and target <= current:
        return (1, why) if current == 0 else (None, enough)
    return target, why


def _by_probe(summary: RunSummary) -> WorkersAdvice | None:
    """What a num_workers probe decides (a busy one: that nothing is advised), or None where no probe measured."""
    current = summary.settings.num_workers
    probe = summary.probes.num_workers
    if probe is not None and probe.disturbed:
        note = probe.machine_note or "other processes busied the machine"
        why = (
            f"{NOT_MEASURED}: the num_workers probe ran on a busy machine ({note}), so no count is advised; "
            "measure again on a quiet machine"
        )
        return WorkersAdvice(None, why, measured=False)
    measured = _probe_suggestion(summary)
    if measured is not None:
        suggested, reason = measured
        if (
            current is None
            or suggested > current
            or (suggested < current and _probe_compared(probe, suggested))
        ):
            return WorkersAdvice(suggested, f"measured by the num_workers probe: {reason}")
        if current == 0 and not _probe_compared(probe, 0):
            # a probe that timed no worker count beside 0 (its budget spent on a busy machine) cannot undo that 0
            # workers never overlap the step, but the measured hand-off can: it decides where there is one
            charged = charged_choice(summary, None)
            if charged is not None:
                return WorkersAdvice(
                    charged[0], f"{charged[1]} (the num_workers probe timed no worker count beside 0)"
                )
            return WorkersAdvice(
                1,
                "with 0 workers loading never overlaps the step; the num_workers probe found no more needed",
            )
        return WorkersAdvice(None, f"the num_workers probe found nothing faster than {current}: {reason}")
    return None


def estimate_workers(summary: RunSummary) -> tuple[int, str] | None:
    """Workers needed to load one batch per compute time, from the measured means.

    With 0 workers the wait is the whole load time of a batch (never overlapped). With n workers that keep the loop
    waiting, they deliver one batch per step, so one worker needs about n * step to load a batch; in steady state
    the wait with N workers is about max(0, load / N - compute).
    """
    timing, current = summary.timing, summary.settings.num_workers
    step, wait = timing.step_time_ms, timing.data_wait_ms
    if current is None or step is None or wait is None:
        return None
    compute = step.mean - wait.mean
    if timing.gpu_compute_ms is not None:  # the GPU's own time per step: host compute is understated when
        compute = timing.gpu_compute_ms.mean  # the host runs ahead of queued kernels
    if compute <= 0:
        return None
    load_ms = wait.mean if current == 0 else current * step.mean
    target = max(1, math.ceil(WORKERS_MARGIN * load_ms / compute))
    return target, (
        f"estimated: a batch takes ~{_fmt(load_ms)} ms to load and {_fmt(compute)} ms to compute, "
        f"with a {WORKERS_MARGIN}x margin"
    )


def _probe_suggestion(summary: RunSummary) -> tuple[int, str] | None:
    """The num_workers probe's measured suggestion and reason; ``None`` without one, or when the probe's numbers
    were disturbed (a busy machine) and it did not choose."""
    probe = summary.probes.num_workers
    if probe is None or probe.disturbed or probe.suggested is None:
        return None
    return probe.suggested, probe.reason or "no reason recorded"


def _probe_compared(probe: NumWorkersProbe | None, workers: int) -> bool:
    """The probe measured ``workers`` and at least one larger count beside it (a hand-built or failed probe that
    measured nothing cannot take workers away)."""
    measured = {
        c.get("num_workers")
        for c in (probe.candidates if probe is not None else [])
        if isinstance(c, dict) and _num(c.get("batches_per_sec")) and not c.get("error")
    }
    return workers in measured and any(isinstance(n, int) and n > workers for n in measured)
