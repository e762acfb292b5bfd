"""The measured ``num_workers`` suggestion: time temporary DataLoaders instead of guessing.

:func:`probe_num_workers` builds throw-away copies of the user's DataLoader (same dataset, sampler or
batch sampler, collate_fn, batch size, pin_memory, drop_last, worker_init_fn) with ``num_workers`` 0, 1, 2,
4, ... up to the usable cores (past them, up to :func:`waiting_workers_max` and what the free memory holds,
when the caller says the loading waits on storage, network or sleep: waiting workers do not compete for
cores), fetches a bounded number of batches from each within a time budget, and suggests the smallest value
whose loading the step can hide. With 0 workers loading never overlaps the step, so every batch's load time
is a wait however fast the loader is: 0 is chosen only when that wait is under ``INPUT_BOUND_MODERATE_PCT`` of
the predicted step. With N >= 1 workers the steady wait per step is about max(0, load time - compute time):
N is chosen when its rate beats the model's compute rate by a margin. When none does, the value with the
shortest predicted step (compute plus predicted wait) is suggested. Worker start-up (the time to the first
batch) is reported apart from the steady rate. Each candidate is timed in up to ``REPEATS`` fresh starts (new
iterator, new worker processes, each start-up left out of its rate); the slowest start's rate is the one a
selection uses, so one lucky stretch on a noisy machine cannot pick a value that does not keep up. A start reads
until its rate settles (:func:`settled`: a loader that stalls now and then needs many stall cycles in its
window), borrowing the candidate's later starts' time; a rate that never settled within the candidate's share is
named in the reason. The budget fits the run (:func:`probe_budget`).

A candidate that raised, timed out or delivered too few batches for a rate is "not measured", never "not
faster": the reason names it and why. When other processes busied the machine during the probe the rates are
disturbed: the result says so (``disturbed``), lists them and chooses no value.

It never changes the user's DataLoader (nor the random state its sampler or the global RNGs carry), shuts
down every worker it starts, and records a failing candidate instead of raising. The caller runs it
outside timed steps. Uses torch's DataLoader, nothing from Lightning.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from lightning_perf.analysis.numbers import finite, whole
from lightning_perf.analysis.probe_results import NumWorkersProbe
from lightning_perf.analysis.rules.noise import noisy_machine
from lightning_perf.analysis.summary import RunSummary
from lightning_perf.collect.sampling.machine_state import MachineWatch
from lightning_perf.errors import ConfigError
from lightning_perf.probes.loader_copy import copy_loader, preserved_random_state, shutdown_workers
from lightning_perf.probes.worker_choice import (
    DEFAULT_MARGIN,
    MEASURED,
    NOT_MEASURED,
    acceptable,
    predicted_wait_ms,
    rates_list,
    suggest_from_candidates,
)
from lightning_perf.probes.worker_counts import probe_counts

DEFAULT_BUDGET_S = 10.0
# Enough batches for a steady rate on fast pipelines; slow ones stop at their share of the budget first.
MAX_BATCHES_PER_CANDIDATE = 200
# The shortest per-batch timeout given to worker candidates (the remaining budget when that is longer), so a
# hung worker cannot block forever while a slow one still delivers: worker start-up plus a first batch took
# over 1.67 s on a user's busy machine, and a timeout then read as "not faster". Our choice: 10 s, several
# times the slowest start-up we saw. A timeout is an error of that candidate only.
MIN_WORKER_TIMEOUT_S = 10.0
# Each candidate is timed in this many fresh starts (a new iterator, new worker processes): three give a median
# and a slowest rate (the lower end a selection must clear). Our choice, as the trial's default of three rounds.
REPEATS = 3
# A fresh start's steady rate needs at least this many batches after its start-up burst (two intervals).
MIN_STEADY_BATCHES = 3
# A start reads on past its share of the time (within the candidate's slice) until its rate settles: the two
# halves of its steady window within 10% of each other (our choice: the probe's margins are 20% and more), and
# on past MAX_BATCHES_PER_CANDIDATE / REPEATS batches up to this many, for loaders that stall now and then.
SETTLE_TOLERANCE = 0.10
MAX_BATCHES_UNSETTLED = 4 * MAX_BATCHES_PER_CANDIDATE
# The probe's budget as a share of the fit's training time, between a floor and the user's cap: a tool that
# measures the run should not cost more than a fifth of it (our choice). Below the floor each fresh start of a
# candidate gets under ~0.2 s on a 2-core machine, while worker start-up alone took 70-140 ms there under load:
# too short for a steady rate, so "auto" skips the probe.
BUDGET_SHARE = 0.2
MIN_BUDGET_S = 2.0


def probe_budget(train_wall_s: float | None, cap_s: float, mode: str) -> float | None:
    """The probe's budget for a fit of ``train_wall_s`` seconds.

    ``"auto"``: ``BUDGET_SHARE`` of the fit, at most ``cap_s``, and ``None`` (skip) when that share is below
    ``MIN_BUDGET_S``, too short for a verdict. ``"always"``: the user asked for the measurement, so it gets
    the whole ``cap_s`` (``probe_budget_s``) whatever the fit's length; the floor would give each fresh start
    of each candidate a few batches, too few for a verdict that does not flip.
    """
    if mode == "always":
        return cap_s
    share = BUDGET_SHARE * train_wall_s if train_wall_s and train_wall_s > 0 else 0.0
    return None if share < MIN_BUDGET_S else min(share, cap_s)


def probe_num_workers(
    dataloader: DataLoader,
    compute_ms_per_batch: float | None,
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    max_workers: int | None = None,
    margin: float = DEFAULT_MARGIN,
    loading_waits: bool = False,
    handoff_main_ms: float | None = None,
) -> NumWorkersProbe:
    """Measure batches/s for increasing ``num_workers`` and suggest the smallest whose loading the step hides.

    Args:
        dataloader: the user's training DataLoader; only read, never changed.
        compute_ms_per_batch: the model's measured compute time per batch; ``None`` suggests the smallest
            value within ``margin`` of the fastest instead.
        budget_s: total time for all candidates (loose: a batch in flight is finished).
        max_workers: largest ``num_workers`` to try; default the usable CPU cores, or past them with
            ``loading_waits`` (see :func:`probe_counts`).
        margin: how much faster than compute the delivery of 1 or more workers must be.
        loading_waits: the caller measured that the loading waits (storage, network, sleep: CPU time well
            below wall time), so workers beyond the cores can still add delivery.
        handoff_main_ms: the training thread's CPU time per batch a worker hands over
            (:mod:`lightning_perf.probes.handoff`): the least wait any worker count leaves; ``None``: not measured.
    """
    _check_arguments(
        dataloader, compute_ms_per_batch, budget_s, max_workers, margin, loading_waits, handoff_main_ms
    )
    floor = float(handoff_main_ms or 0.0)
    counts, counts_note = probe_counts(max_workers, loading_waits)
    target = None if compute_ms_per_batch is None else 1000.0 / compute_ms_per_batch
    watch = MachineWatch()  # before the deadline: its first reading is not charged to the candidates
    deadline = time.perf_counter() + budget_s
    candidates, kept_up = _sweep(dataloader, counts, deadline, target, margin, floor)
    notes = _sweep_notes(dataloader, budget_s, counts, counts_note, candidates, kept_up)
    noisy = noisy_machine(RunSummary(machine=watch.finish()), None)
    note = ""
    if noisy is None:
        suggested, reason = suggest_from_candidates(candidates, target, margin, floor)
    else:
        note = noisy.evidence.removeprefix("During the run ").split(":")[0]
        suggested, reason = (
            None,
            (
                f"measured on a busy machine ({note}): the rates are disturbed, so no value is chosen; "
                f"repeat on a quiet machine; measured: {rates_list(candidates)}"
            ),
        )
    reason = "; ".join([reason, *notes])
    return NumWorkersProbe(
        candidates=candidates,
        compute_batches_per_sec=target,
        suggested=suggested,
        reason=reason,
        machine_note=note,
        loading_waits=loading_waits,
        disturbed=noisy is not None,
    )


def _check_arguments(
    dataloader: Any,
    compute_ms_per_batch: Any,
    budget_s: Any,
    max_workers: Any,
    margin: Any,
    loading_waits: Any,
    handoff_main_ms: Any,
) -> None:
    """:class:`ConfigError` naming the first argument of :func:`probe_num_workers` that is not allowed."""
    if not isinstance(dataloader, DataLoader):
        raise ConfigError(
            f"dataloader: expected a torch.utils.data.DataLoader, got {type(dataloader).__name__}"
        )
    if compute_ms_per_batch is not None and not _positive(compute_ms_per_batch):
        raise ConfigError(
            f"compute_ms_per_batch: expected a positive number or None, got {compute_ms_per_batch!r}"
        )
    if not _positive(budget_s):
        raise ConfigError(f"budget_s: expected a positive number of seconds, got {budget_s!r}")
    if max_workers is not None and whole(max_workers) is None:
        raise ConfigError(f"max_workers: expected an int >= 0 or None, got {max_workers!r}")
    if max_workers is not None and max_workers < 0:
        raise ConfigError(f"max_workers: expected an int >= 0 or None, got {max_workers}")
    if not _positive(margin):
        raise ConfigError(f"margin: expected a positive number, got {margin!r}")
    if not isinstance(loading_waits, bool):
        raise ConfigError(f"loading_waits: expected True or False, got {loading_waits!r}")
    if handoff_main_ms is not None and (finite(handoff_main_ms) is None or handoff_main_ms < 0):
        raise ConfigError(f"handoff_main_ms: expected a number >= 0 or None, got {handoff_main_ms!r}")


def _sweep(
    dataloader: DataLoader,
    counts: list[int],
    deadline: float,
    target: float | None,
    margin: float,
    floor: float,
) -> tuple[list[dict[str, Any]], bool]:
    """The measured candidates, in order of ``counts`` until the deadline or the first that keeps up with
    ``target``, and whether that last one did."""
    candidates: list[dict[str, Any]] = []
    kept_up = False
    with preserved_random_state(dataloader), warnings.catch_warnings():
        # torch warns about more workers than cores, or pin_memory without CUDA; the probe decides itself
        warnings.filterwarnings("ignore", message=r".*(worker|pin_memory).*", category=UserWarning)
        for index, workers in enumerate(counts):
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                break
            result = _measure(dataloader, workers, remaining / (len(counts) - index), remaining)
            wait = predicted_wait_ms(result, target, floor)
            result["predicted_wait_ms"] = wait
            result["predicted_step_ms"] = None if wait is None or target is None else 1000.0 / target + wait
            candidates.append(result)
            kept_up = target is not None and acceptable(result, target, margin)
            if kept_up:
                break  # the smallest value that keeps up is found; larger ones only cost budget
    return candidates, kept_up


def _sweep_notes(
    dataloader: DataLoader,
    budget_s: float,
    counts: list[int],
    counts_note: str,
    candidates: list[dict[str, Any]],
    kept_up: bool,
) -> list[str]:
    """What the reason adds after the verdict: a budget that ran out, capped counts, unsettled rates, and an
    IterableDataset whose workers may replay it."""
    notes = []
    if len(candidates) < len(counts) and not kept_up:
        notes.append(f"the budget of {budget_s:g} s ran out before num_workers={counts[len(candidates)]}")
    if counts_note:
        notes.append(counts_note)
    unsettled = [c["num_workers"] for c in candidates if c["status"] == MEASURED and not c["settled"]]
    if unsettled:
        notes.append(
            f"the rate of num_workers={', '.join(map(str, unsettled))} had not settled within its share of the "
            f"budget (a loader that stalls now and then needs a longer read: raise probe_budget_s)"
        )
    if isinstance(dataloader.dataset, IterableDataset) and any(c["num_workers"] > 0 for c in candidates):
        notes.append(
            "IterableDataset: each worker replays the iterable unless the dataset shards itself "
            "(get_worker_info), so worker rates may count duplicate samples"
        )
    return notes


def _measure(dataloader: DataLoader, workers: int, slice_s: float, remaining_s: float) -> dict[str, Any]:
    """Time a copy with ``workers`` workers in ``REPEATS`` fresh starts within ``slice_s``."""
    result: dict[str, Any] = {
        "num_workers": workers,
        "status": NOT_MEASURED,
        "startup_ms": None,
        "batches_per_sec": None,
        "repeat_rates": [],
        "batches": 0,
        "error": None,
        "predicted_wait_ms": None,
        "predicted_step_ms": None,
        "settled": True,
    }
    start = time.perf_counter()
    first_s = 0.0
    try:
        loader = copy_loader(dataloader, workers, timeout_s=max(remaining_s, MIN_WORKER_TIMEOUT_S))
        for repeat in range(REPEATS):
            now = time.perf_counter()
            # another start needs about what the first took to settle: a shorter one would misread the rate
            if repeat and now + first_s >= start + slice_s:
                break
            stream = _time_stream(loader, workers, start + slice_s * (repeat + 1) / REPEATS, start + slice_s)
            first_s = first_s or time.perf_counter() - now
            result["batches"] += stream.batches
            result["settled"] = result["settled"] and stream.settled
            if result["startup_ms"] is None:
                result["startup_ms"] = stream.startup_ms
            if stream.steady_batches > 0 and stream.steady_s > 0:
                result["repeat_rates"].append(stream.steady_batches / stream.steady_s)
    except Exception as err:  # a failing candidate is a result, never a crash of the training it watches
        result["error"] = f"{type(err).__name__}: {err}"
        return result
    elapsed = max(time.perf_counter() - start, 1e-9)
    if result["repeat_rates"]:
        result["batches_per_sec"] = statistics.median(result["repeat_rates"])
    elif workers == 0 and result["batches"] > 0:
        # no steady interval, but the main process has no worker start-up: its batches over the time they
        # took are its load rate (iterator creation counted in, which can only under-state it)
        result["batches_per_sec"] = result["batches"] / elapsed
    else:
        result["error"] = (
            f"too few batches for a rate: {result['batches']} in {elapsed:.2f} s, none after the workers' "
            "start-up burst"
        )
        return result
    result["status"] = MEASURED
    return result


@dataclass
class _Stream:
    batches: int = 0
    startup_ms: float | None = None
    steady_batches: int = 0  # batches after the start-up burst, and the seconds they took
    steady_s: float = 0.0
    settled: bool = False  # the last window's rate settled (:func:`settled`)


def settled(intervals: list[float]) -> bool:
    """Whether a steady read's rate has settled: over its last third, the rate from its start stays within
    ``SETTLE_TOLERANCE`` of the rate over the whole read. ``intervals``: the seconds between its batches (across
    restarts of a short epoch; each start-up left out). A loader whose batches stall now and then (every 32nd
    sample a 100 ms read) delivers in bursts, and a read holding part of a stall cycle misreads it: 4 and 8
    workers read 30 and 46 batches/s in short windows, 40 and 79 in a 4 s read. The rate from the start swings
    with each stall until the read holds many cycles; two halves of a read compare equal however few it holds."""
    count = len(intervals)
    if count < 3 * MIN_STEADY_BATCHES:
        return False
    elapsed = list(itertools.accumulate(intervals))
    first = math.ceil(2 * count / 3)
    rates = [k / elapsed[k - 1] for k in range(first, count + 1) if elapsed[k - 1] > 0]
    return bool(rates) and max(rates) <= (1.0 + SETTLE_TOLERANCE) * min(rates)


def _time_stream(loader: DataLoader, workers: int, end: float, last_end: float) -> _Stream:
    """Fetch from fresh iterators (new workers) until ``end``; the start-up and its burst are not steady time.

    A start whose steady rate has not settled by ``end`` (slow worker start-up, or a loader that stalls now
    and then: :func:`settled`) goes on until it has, or until ``last_end``, the end of the candidate's whole
    slice: it borrows from the candidate's later starts, never from the other candidates."""
    stream = _Stream()
    # batches the workers may have had ready when the first arrived (each keeps prefetch_factor in flight): a
    # burst, not the steady rate; counting it made 4 workers of a ~200 batches/s loader read 6659 under load
    most = math.ceil(MAX_BATCHES_PER_CANDIDATE / REPEATS)
    in_flight = workers * (loader.prefetch_factor or 2) if workers else 0
    try:  # an epoch shorter than the burst: whatever it has after its first batch is all there is
        per_epoch = len(loader)
    except TypeError:  # an IterableDataset without a length
        per_epoch = most
    warmup = max(0, min(in_flight - 1, most - MIN_STEADY_BATCHES - 1, per_epoch - 2))
    started = time.perf_counter()
    intervals: list[float] = []
    check_at = 0
    while True:
        iterator = iter(loader)  # also after the data ran out: a restart, its start-up again left out
        fetched, previous = 0, 0.0
        try:
            for _ in iterator:
                last = time.perf_counter()
                stream.batches += 1
                if stream.startup_ms is None:
                    stream.startup_ms = (last - started) * 1000.0
                if fetched > warmup:
                    intervals.append(last - previous)
                previous = last
                fetched += 1
                if last >= last_end or stream.batches >= MAX_BATCHES_UNSETTLED:
                    break
                # settling is looked at as the read grows by a quarter: its cost stays off most batches
                if (last >= end or stream.batches >= most) and len(intervals) >= check_at:
                    stream.settled = settled(intervals)
                    if stream.settled:
                        break
                    check_at = math.ceil(len(intervals) * 1.25)
        finally:
            shutdown_workers(iterator)
        if fetched == 0:
            raise RuntimeError("the DataLoader yielded no batches")
        now = time.perf_counter()
        if stream.settled or stream.batches >= MAX_BATCHES_UNSETTLED or now >= last_end:
            break
    stream.steady_batches, stream.steady_s = len(intervals), math.fsum(intervals)
    return stream


def _positive(value: Any) -> bool:
    number = finite(value)
    return number is not None and number > 0
