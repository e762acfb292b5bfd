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
batch) is reported apart from the steady rate. Each candidate is timed in ``REPEATS`` fresh starts (new
iterator, new worker processes, each start-up left out of its rate); the slowest start's rate is the one a
selection uses, so one lucky stretch on a noisy machine cannot pick a value that does not keep up. The
budget fits the run (:func:`probe_budget`).

A candidate that raised, timed out or delivered too few batches for a rate is "not measured", never "not
faster": the reason names it and why. When other processes busied the machine during the probe the rates are
disturbed: the result says so (``disturbed``), lists them and chooses no value.

It never changes the user's DataLoader (nor the random state its sampler or the global RNGs carry), shuts
down every worker it starts, and records a failing candidate instead of raising. The caller runs it
outside timed steps. Uses torch's DataLoader, nothing from Lightning.
"""

from __future__ import annotations

import contextlib
import math
import random
import statistics
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil
import torch
from torch.utils.data import DataLoader, IterableDataset

from lightning_perf.analysis.numbers import finite, whole
from lightning_perf.analysis.rules.noise import noisy_machine
from lightning_perf.analysis.rules.thresholds import INPUT_BOUND_MODERATE_PCT, WORKERS_MARGIN
from lightning_perf.analysis.summary import RunSummary
from lightning_perf.collect.sampling.machine_state import MachineWatch
from lightning_perf.collect.sampling.utilization import usable_cpu_count

# Delivery must beat the model's compute rate by this factor (shared with the diagnosis' estimate).
DEFAULT_MARGIN = WORKERS_MARGIN
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
# The probe's budget as a share of the fit's training time, between a floor and the user's cap: a tool that
# measures the run should not cost more than a fifth of it (our choice). Below the floor each fresh start of a
# candidate gets under ~0.2 s on a 2-core machine, while worker start-up alone took 70-140 ms there under load:
# too short for a steady rate, so "auto" skips the probe.
BUDGET_SHARE = 0.2
MIN_BUDGET_S = 2.0
# num_workers=0 loads in the training process, never beside the step: it is acceptable only when that wait is
# below this share of its predicted step, TensorFlow's "moderately input-bound" line (thresholds.py).
ZERO_WORKERS_WAIT_PCT = INPUT_BOUND_MODERATE_PCT
# When no value keeps up, the smallest num_workers whose predicted step is within this share of the shortest is
# suggested. Our choice: the same 5% line, below which a difference in step time is not worth more processes.
NEAR_BEST_STEP_PCT = 5.0
# Loading that waits (storage, network, sleep: CPU time well below wall time) leaves the cores idle, so workers
# that sleep do not compete for them and the candidates go past the usable cores, up to
# waiting_workers_max(cores) = max(WAITING_WORKERS_MIN, WAITING_WORKERS_PER_CORE x cores), at most
# WAITING_WORKERS_MAX. Our choices: a worker that waits most of its time uses a quarter of a core or less, so 4 a
# core; at least 8, so even a 2-core machine keeps several requests in flight to hide their latency; at most 32,
# since each worker is a process holding its own dataset copy and prefetch_factor batches, and each doubling
# is one more candidate sharing the budget.
WAITING_WORKERS_PER_CORE = 4
WAITING_WORKERS_MIN = 8
WAITING_WORKERS_MAX = 32
# Memory bound on those candidates: a worker's resident memory as a share of the training process's RSS. An
# estimate, not a measurement: forked workers share the trainer's pages until they write them, and on typical
# datasets a worker's own resident set stays at most about half the trainer's (the model, optimizer state and
# CUDA context stay in the trainer). Candidate counts stop where count x this x RSS exceeds the available memory.
WORKER_RSS_SHARE = 0.5

MEASURED = "measured"
NOT_MEASURED = "not measured"


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


@dataclass
class NumWorkersProbe:
    """The probe's result; JSON-serialisable via ``dataclasses.asdict`` (``summary.probes["num_workers"]``).

    ``candidates`` holds one dict per tried ``num_workers``: ``num_workers``, ``status`` (``"measured"`` or
    ``"not measured"``), ``startup_ms`` (time to the first batch), ``batches_per_sec`` (steady delivery rate,
    the median of the fresh starts; ``None`` when not measured), ``repeat_rates`` (the steady rate of each fresh
    start; their minimum is the rate a selection uses), ``batches`` (fetched in all), ``error`` (``None``, or
    why the candidate was not measured), ``predicted_wait_ms`` (the loop's predicted wait for data per step:
    the whole load time of a batch with 0 workers, max(0, load time - compute time) with 1 or more; ``None``
    when not measured or without a compute rate) and ``predicted_step_ms`` (compute plus that wait).

    ``loading_waits`` is the caller's word that the loading waits (CPU time well below wall time), which let
    the candidates go past the usable cores. ``disturbed`` is True when other processes busied the machine
    while it measured: the rates are then not used and ``suggested`` is ``None``. ``machine_note`` says what
    busied it ("" otherwise).
    """

    candidates: list[dict[str, Any]] = field(default_factory=list)
    compute_batches_per_sec: float | None = None
    suggested: int | None = None
    reason: str = ""
    machine_note: str = ""
    loading_waits: bool = False
    disturbed: bool = False


def probe_num_workers(
    dataloader: DataLoader,
    compute_ms_per_batch: float | None,
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    max_workers: int | None = None,
    margin: float = DEFAULT_MARGIN,
    loading_waits: bool = False,
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
    """
    if not isinstance(dataloader, DataLoader):
        raise ValueError(
            f"dataloader: expected a torch.utils.data.DataLoader, got {type(dataloader).__name__}"
        )
    if compute_ms_per_batch is not None and not _positive(compute_ms_per_batch):
        raise ValueError(
            f"compute_ms_per_batch: expected a positive number or None, got {compute_ms_per_batch!r}"
        )
    if not _positive(budget_s):
        raise ValueError(f"budget_s: expected a positive number of seconds, got {budget_s!r}")
    if max_workers is not None and whole(max_workers) is None:
        raise ValueError(f"max_workers: expected an int >= 0 or None, got {max_workers!r}")
    if max_workers is not None and max_workers < 0:
        raise ValueError(f"max_workers: expected an int >= 0 or None, got {max_workers}")
    if not _positive(margin):
        raise ValueError(f"margin: expected a positive number, got {margin!r}")
    if not isinstance(loading_waits, bool):
        raise ValueError(f"loading_waits: expected True or False, got {loading_waits!r}")

    counts, counts_note = probe_counts(max_workers, loading_waits)
    target = None if compute_ms_per_batch is None else 1000.0 / compute_ms_per_batch
    watch = MachineWatch()  # before the deadline: its first reading is not charged to the candidates
    deadline = time.perf_counter() + budget_s
    candidates: list[dict[str, Any]] = []
    kept_up = False
    with _preserved_random_state(dataloader), warnings.catch_warnings():
        # torch warns about more workers than cores, or pin_memory without CUDA; the probe decides itself
        warnings.filterwarnings("ignore", message=r".*(worker|pin_memory).*", category=UserWarning)
        for index, workers in enumerate(counts):
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                break
            result = _measure(dataloader, workers, remaining / (len(counts) - index), remaining)
            wait = predicted_wait_ms(result, target)
            result["predicted_wait_ms"] = wait
            result["predicted_step_ms"] = None if wait is None or target is None else 1000.0 / target + wait
            candidates.append(result)
            kept_up = target is not None and _acceptable(result, target, margin)
            if kept_up:
                break  # the smallest value that keeps up is found; larger ones only cost budget
    notes = []
    if len(candidates) < len(counts) and not kept_up:
        notes.append(f"the budget of {budget_s:g} s ran out before num_workers={counts[len(candidates)]}")
    if counts_note:
        notes.append(counts_note)
    if isinstance(dataloader.dataset, IterableDataset) and any(c["num_workers"] > 0 for c in candidates):
        notes.append(
            "IterableDataset: each worker replays the iterable unless the dataset shards itself "
            "(get_worker_info), so worker rates may count duplicate samples"
        )
    noisy = noisy_machine(RunSummary(machine=watch.finish()), None)
    note = ""
    if noisy is None:
        suggested, reason = suggest_from_candidates(candidates, target, margin)
    else:
        note = noisy.evidence.removeprefix("During the run ").split(":")[0]
        suggested, reason = (
            None,
            (
                f"measured on a busy machine ({note}): the rates are disturbed, so no value is chosen; "
                f"repeat on a quiet machine; measured: {_rates_list(candidates)}"
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


def waiting_workers_max(cores: int) -> int:
    """The largest ``num_workers`` tried for loading that waits on ``cores`` usable cores (see the constants)."""
    return min(WAITING_WORKERS_MAX, max(WAITING_WORKERS_MIN, WAITING_WORKERS_PER_CORE * cores))


def probe_counts(max_workers: int | None = None, loading_waits: bool = False) -> tuple[list[int], str]:
    """The ``num_workers`` values to try, and a note when memory cut them short ("" otherwise).

    ``max_workers`` given: :func:`candidate_counts` up to it. Otherwise up to the usable cores, and with
    ``loading_waits`` past them up to :func:`waiting_workers_max`, stopping at the first count whose workers
    would not fit the available memory (each estimated at ``WORKER_RSS_SHARE`` of this process's RSS; when
    memory cannot be read the counts stay at the cores).
    """
    if max_workers is not None:
        return candidate_counts(max_workers), ""
    cores = usable_cpu_count()
    counts = candidate_counts(cores)
    if not loading_waits:
        return counts, ""
    beyond = [n for n in candidate_counts(waiting_workers_max(cores)) if n > cores]
    if not beyond:
        return counts, ""
    try:
        available = float(psutil.virtual_memory().available)
        per_worker = WORKER_RSS_SHARE * float(psutil.Process().memory_info().rss)
    except Exception as err:  # /proc unreadable: no memory bound to trust, so no candidates past the cores
        return (
            counts,
            f"memory could not be read ({type(err).__name__}), so candidates stop at the {cores} cores",
        )
    for workers in beyond:
        if available < workers * per_worker:
            return counts, (
                f"candidates stop before num_workers={workers}: that many workers would take about "
                f"{workers * per_worker / 2**30:.1f} GiB (each an estimated {WORKER_RSS_SHARE:g}x this "
                f"process's resident memory), more than the {available / 2**30:.1f} GiB available"
            )
        counts.append(workers)
    return counts, ""


def candidate_counts(max_workers: int) -> list[int]:
    """0, 1, 2, 4, ... doubling up to ``max_workers``, which is always included."""
    counts, workers = [0], 1
    while workers <= max_workers:
        counts.append(workers)
        workers *= 2
    if counts[-1] != max_workers:
        counts.append(max_workers)
    return counts


def _is_measured(candidate: dict[str, Any]) -> bool:
    """Measured with a rate; hand-built candidates without a ``status`` count when they have a rate and no error."""
    if candidate.get("batches_per_sec") is None:
        return False
    status = candidate.get("status")
    return status == MEASURED if status is not None else not candidate.get("error")


def _slowest_rate(candidate: dict[str, Any]) -> float | None:
    """The candidate's rate a selection uses: its slowest start's, or its overall rate."""
    repeats = candidate.get("repeat_rates") or []
    return min(repeats) if repeats else candidate.get("batches_per_sec")


def predicted_wait_ms(candidate: dict[str, Any], compute_batches_per_sec: float | None) -> float | None:
    """The loop's predicted wait for data per step with this candidate, from its slowest start's rate.

    0 workers: loading never overlaps the step, so the whole load time of a batch (1000 / rate) is waited.
    N >= 1 workers, steady state: they load while the step computes, so the wait is what loading takes beyond
    the compute time, max(0, 1000 / rate - compute_ms). ``None`` when not measured or without a compute rate.
    """
    rate = _slowest_rate(candidate) if _is_measured(candidate) else None
    if rate is None or rate <= 0 or compute_batches_per_sec is None:
        return None
    load_ms = 1000.0 / rate
    if candidate["num_workers"] == 0:
        return load_ms
    return max(0.0, load_ms - 1000.0 / compute_batches_per_sec)


def _acceptable(candidate: dict[str, Any], compute_batches_per_sec: float, margin: float) -> bool:
    """0 workers: the predicted wait under ``ZERO_WORKERS_WAIT_PCT`` of the step; N >= 1: the slowest start's
    rate at least ``margin`` x the model's."""
    if not _is_measured(candidate):
        return False
    if candidate["num_workers"] == 0:
        wait = predicted_wait_ms(candidate, compute_batches_per_sec)
        step = 1000.0 / compute_batches_per_sec + (wait or 0.0)
        return wait is not None and wait < ZERO_WORKERS_WAIT_PCT / 100.0 * step
    return (_slowest_rate(candidate) or 0.0) >= margin * compute_batches_per_sec


def _rate_text(candidate: dict[str, Any]) -> str:
    repeats = candidate.get("repeat_rates") or []
    text = f"{candidate['batches_per_sec']:.1f} batches/s"
    if len(repeats) > 1:
        text += f" ({min(repeats):.1f}-{max(repeats):.1f} over {len(repeats)} fresh starts)"
    return text


def _why(candidate: dict[str, Any]) -> str:
    """The candidate's error on one line: a worker's error carries its traceback, whose last line is the cause."""
    lines = [line.strip() for line in str(candidate.get("error") or "no rate").splitlines() if line.strip()]
    if not lines:
        return "no rate"
    return lines[0] if len(lines) == 1 or lines[-1] == lines[0] else f"{lines[0]} ... {lines[-1]}"


def _not_measured_text(candidates: list[dict[str, Any]]) -> str:
    """``num_workers=1, 2: not measured (why)`` for the candidates without a rate, grouped by reason."""
    groups: dict[str, list[str]] = {}
    for candidate in candidates:
        if not _is_measured(candidate):
            why = _why(candidate)
            groups.setdefault(why, []).append(str(candidate["num_workers"]))
    return "; ".join(
        f"num_workers={', '.join(counts)}: {NOT_MEASURED} ({why})" for why, counts in groups.items()
    )


def _rates_list(candidates: list[dict[str, Any]]) -> str:
    """Every candidate's rate, or why it has none."""
    parts = [
        f"num_workers={c['num_workers']}: {_rate_text(c)}"
        if _is_measured(c)
        else f"num_workers={c['num_workers']}: {NOT_MEASURED} ({_why(c)})"
        for c in candidates
    ]
    return ", ".join(parts) if parts else "nothing"


def _zero_text(measured: list[dict[str, Any]], compute_batches_per_sec: float) -> str:
    """``against X ms with num_workers=0 (no overlap)`` where 0 was measured."""
    zero = next((c for c in measured if c["num_workers"] == 0), None)
    wait = predicted_wait_ms(zero, compute_batches_per_sec) if zero is not None else None
    return "" if wait is None else f" against {wait:.1f} ms with num_workers=0 (no overlap)"


def suggest_from_candidates(
    candidates: list[dict[str, Any]], compute_batches_per_sec: float | None, margin: float = DEFAULT_MARGIN
) -> tuple[int | None, str]:
    """The suggestion and its reason from the tried candidates (in increasing ``num_workers``).

    With a compute rate: the smallest acceptable value (0 when its predicted wait, paid in full, is under
    ``ZERO_WORKERS_WAIT_PCT`` of its predicted step; N >= 1 when its slowest rate is at least ``margin`` x the
    model's), else the value with the shortest predicted step, the smallest within ``NEAR_BEST_STEP_PCT`` of it.
    Without one: the smallest value within ``margin`` of the fastest. Candidates not measured are never taken
    for slower: the reason names them and why.
    """
    measured = [c for c in candidates if _is_measured(c)]
    unmeasured = _not_measured_text(candidates)
    tail = f"; {unmeasured}" if unmeasured else ""
    if not measured:
        return None, "no candidate was measured, so no value is chosen" + (
            f": {unmeasured}" if unmeasured else ""
        )
    if compute_batches_per_sec is None:
        fastest = max(measured, key=lambda c: c["batches_per_sec"])
        line = fastest["batches_per_sec"] / margin
        pick = next(c for c in measured if c["batches_per_sec"] >= line)
        return pick["num_workers"], (
            f"no compute rate measured: num_workers={pick['num_workers']} delivers "
            f"{pick['batches_per_sec']:.1f} batches/s, within {margin:g}x of the fastest measured "
            f"({fastest['batches_per_sec']:.1f} batches/s with {fastest['num_workers']})" + tail
        )
    compute_ms = 1000.0 / compute_batches_per_sec
    model = f"the model's {compute_batches_per_sec:.1f} batches/s"
    pick = next((c for c in measured if _acceptable(c, compute_batches_per_sec, margin)), None)
    if pick is not None and pick["num_workers"] == 0:
        wait = predicted_wait_ms(pick, compute_batches_per_sec) or 0.0
        return 0, (
            f"num_workers=0 delivers {_rate_text(pick)}: its predicted wait, {wait:.1f} ms a step (loading "
            f"never overlaps the step without workers), is {100.0 * wait / (compute_ms + wait):.1f}% of the "
            f"predicted {compute_ms + wait:.1f} ms step, below {ZERO_WORKERS_WAIT_PCT:g}%" + tail
        )
    if pick is not None:
        slowest = "even in its slowest start, " if len(pick.get("repeat_rates") or []) > 1 else ""
        wait = predicted_wait_ms(pick, compute_batches_per_sec) or 0.0
        return pick["num_workers"], (
            f"num_workers={pick['num_workers']} delivers {_rate_text(pick)}, {slowest}at least {margin:g}x "
            f"{model}: predicted wait {wait:.1f} ms a step{_zero_text(measured, compute_batches_per_sec)}"
            + tail
        )

    def step(candidate: dict[str, Any]) -> float:
        return compute_ms + (predicted_wait_ms(candidate, compute_batches_per_sec) or 0.0)

    best = min(step(c) for c in measured)
    pick = next(c for c in measured if step(c) <= best * (1.0 + NEAR_BEST_STEP_PCT / 100.0))
    wait = step(pick) - compute_ms
    head = (
        "the input pipeline cannot keep up: no measured value does"
        if wait > 0
        else "no measured value keeps up"
    )
    return pick["num_workers"], (
        f"{head} (1 or more workers at {margin:g}x {model}, or 0 with a wait under "
        f"{ZERO_WORKERS_WAIT_PCT:g}% of its step); num_workers={pick['num_workers']} has the shortest predicted "
        f"step, {step(pick):.1f} ms, delivering {_rate_text(pick)}: predicted wait {wait:.1f} ms a step"
        f"{_zero_text(measured, compute_batches_per_sec) if pick['num_workers'] else ''}" + tail
    )


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
    }
    start = time.perf_counter()
    try:
        loader = _copy(dataloader, workers, timeout_s=max(remaining_s, MIN_WORKER_TIMEOUT_S))
        for repeat in range(REPEATS):
            if repeat and time.perf_counter() >= start + slice_s:
                break  # slow batches used the slice up: no time for another start
            stream = _time_stream(loader, workers, start + slice_s * (repeat + 1) / REPEATS, start + slice_s)
            result["batches"] += stream.batches
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


def _time_stream(loader: DataLoader, workers: int, end: float, last_end: float) -> _Stream:
    """Fetch from fresh iterators (new workers) until ``end``; the start-up and its burst are not steady time.

    A start that has no steady rate by ``end`` (slow worker start-up) goes on until it has one or until
    ``last_end``, the end of the candidate's whole slice: it borrows from the candidate's later starts, never
    from the other candidates."""
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
    while True:
        iterator = iter(loader)  # also after the data ran out: a restart, its start-up again left out
        fetched, clock_start, last = 0, None, started
        try:
            for _ in iterator:
                last = time.perf_counter()
                stream.batches += 1
                if stream.startup_ms is None:
                    stream.startup_ms = (last - started) * 1000.0
                if fetched == warmup:
                    clock_start = last
                fetched += 1
                steady = fetched >= warmup + MIN_STEADY_BATCHES or last >= last_end
                if (last >= end and steady) or stream.batches >= most:
                    break
        finally:
            _shutdown(iterator)
        if clock_start is not None and fetched > warmup + 1:
            stream.steady_batches += fetched - warmup - 1
            stream.steady_s += last - clock_start
        if fetched == 0:
            raise RuntimeError("the DataLoader yielded no batches")
        now = time.perf_counter()
        if stream.batches >= most or now >= last_end or (now >= end and stream.steady_batches > 0):
            return stream


def _copy(dataloader: DataLoader, workers: int, timeout_s: float) -> DataLoader:
    """A DataLoader over the same data with ``workers`` workers; no generator, no persistent workers."""
    kwargs: dict[str, Any] = {
        "num_workers": workers,
        "collate_fn": dataloader.collate_fn,
        "pin_memory": dataloader.pin_memory,
        "worker_init_fn": dataloader.worker_init_fn,
        "persistent_workers": False,
    }
    for name in ("pin_memory_device", "in_order"):  # newer torch only
        if hasattr(dataloader, name):
            kwargs[name] = getattr(dataloader, name)
    if workers > 0:
        kwargs["timeout"] = dataloader.timeout if dataloader.timeout > 0 else timeout_s
        kwargs["multiprocessing_context"] = dataloader.multiprocessing_context
        if dataloader.prefetch_factor is not None:
            kwargs["prefetch_factor"] = dataloader.prefetch_factor
    if isinstance(dataloader.dataset, IterableDataset):
        kwargs.update(batch_size=dataloader.batch_size, drop_last=dataloader.drop_last)
    elif dataloader.batch_sampler is not None:
        kwargs["batch_sampler"] = dataloader.batch_sampler  # carries the sampler, batch size and drop_last
    else:
        kwargs.update(sampler=dataloader.sampler, batch_size=None)
    return DataLoader(dataloader.dataset, **kwargs)


def _shutdown(iterator: Any) -> None:
    # joins the worker processes now instead of whenever the iterator is garbage-collected
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


@contextlib.contextmanager
def _preserved_random_state(dataloader: DataLoader) -> Iterator[None]:
    """Restore every RNG the probe advances: the sampler's generator, torch's, Python's and NumPy's.

    Shuffling samplers draw from their generator, each new iterator draws a worker seed from torch's
    global RNG, and with 0 workers the dataset's transforms run here and draw from the global RNGs.
    """
    generators = {}
    for owner in (dataloader, dataloader.sampler, getattr(dataloader.batch_sampler, "sampler", None)):
        generator = getattr(owner, "generator", None)
        if isinstance(generator, torch.Generator):
            generators[id(generator)] = (generator, generator.get_state())
    torch_state, python_state = torch.get_rng_state(), random.getstate()
    numpy = sys.modules.get("numpy")  # only if the program uses it; never imported here
    numpy_state = numpy.random.get_state() if numpy is not None else None
    try:
        yield
    finally:
        for generator, state in generators.values():
            generator.set_state(state)
        torch.set_rng_state(torch_state)
        random.setstate(python_state)
        if numpy is not None:
            numpy.random.set_state(numpy_state)


def _positive(value: Any) -> bool:
    number = finite(value)
    return number is not None and number > 0
