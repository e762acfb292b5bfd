"""The measured ``num_workers`` suggestion: time temporary DataLoaders instead of guessing.

:func:`probe_num_workers` builds throw-away copies of the user's DataLoader (same dataset, sampler or
batch sampler, collate_fn, batch size, pin_memory, drop_last, worker_init_fn) with ``num_workers`` 0, 1, 2,
4, ... up to the usable cores, fetches a bounded number of batches from each within a time budget, and
suggests the smallest value whose steady delivery rate beats the model's compute rate by a margin.
Worker start-up (the time to the first batch) is reported apart from the steady rate. Each candidate's steady
stream is timed in ``SEGMENTS`` consecutive segments; the slowest segment's rate is the one that must clear
the model's rate, so one lucky stretch on a noisy machine cannot pick a value that does not keep up. The
budget fits the run (:func:`probe_budget`), and when other processes busied the machine during the probe the
reason says so.

It never changes the user's DataLoader (nor the random state its sampler or the global RNGs carry), shuts
down every worker it starts, and records a failing candidate instead of raising. The caller runs it
outside timed steps. Uses torch's DataLoader, nothing from Lightning.
"""

from __future__ import annotations

import contextlib
import math
import random
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from lightning_perf.analysis.numbers import finite, whole
from lightning_perf.analysis.rules_noise import noisy_machine
from lightning_perf.analysis.summary import RunSummary
from lightning_perf.analysis.thresholds import WORKERS_MARGIN
from lightning_perf.collect.machine_state import MachineWatch
from lightning_perf.collect.utilization import usable_cpu_count

# Delivery must beat the model's compute rate by this factor (shared with the diagnosis' estimate).
DEFAULT_MARGIN = WORKERS_MARGIN
DEFAULT_BUDGET_S = 10.0
# Enough batches for a steady rate on fast pipelines; slow ones stop at their share of the budget first.
MAX_BATCHES_PER_CANDIDATE = 200
# The shortest per-batch timeout given to worker candidates, so a hung worker cannot block forever.
MIN_WORKER_TIMEOUT_S = 1.0
# Consecutive segments each candidate's steady stream is timed in: three give a median and a slowest rate
# (the interval's lower end a selection must clear). Our choice, as the trial's default of three rounds.
SEGMENTS = 3
# The probe's budget as a share of the fit's training time, between a floor and the user's cap: a tool that
# measures the run should not cost more than a fifth of it (our choice). Below the floor a candidate gets
# under a quarter second, too short for a steady rate with worker start-up, so "auto" skips the probe.
BUDGET_SHARE = 0.2
MIN_BUDGET_S = 1.0


def probe_budget(train_wall_s: float | None, cap_s: float, mode: str) -> float | None:
    """The probe's budget for a fit of ``train_wall_s`` seconds: ``BUDGET_SHARE`` of it, at most ``cap_s``.

    ``None`` when ``mode`` is ``"auto"`` and that share is below ``MIN_BUDGET_S`` (too short for a verdict);
    ``"always"`` gets at least the floor.
    """
    share = BUDGET_SHARE * train_wall_s if train_wall_s and train_wall_s > 0 else 0.0
    if share < MIN_BUDGET_S:
        return None if mode == "auto" else min(MIN_BUDGET_S, cap_s)
    return min(share, cap_s)


@dataclass
class NumWorkersProbe:
    """The probe's result; JSON-serialisable via ``dataclasses.asdict`` (``summary.probes["num_workers"]``).

    ``candidates`` holds one dict per measured ``num_workers``: ``num_workers``, ``startup_ms`` (time to the
    first batch), ``batches_per_sec`` (steady delivery rate, ``None`` when not measured),
    ``segment_rates`` (the steady rate of each consecutive segment; their minimum must clear the model),
    ``batches`` (fetched in all) and ``error`` (``None``, or why the candidate failed). ``machine_note`` says
    when other processes busied the machine while it measured ("" otherwise).
    """

    candidates: list[dict[str, Any]] = field(default_factory=list)
    compute_batches_per_sec: float | None = None
    suggested: int | None = None
    reason: str = ""
    machine_note: str = ""


def probe_num_workers(
    dataloader: DataLoader,
    compute_ms_per_batch: float | None,
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    max_workers: int | None = None,
    margin: float = DEFAULT_MARGIN,
) -> NumWorkersProbe:
    """Measure batches/s for increasing ``num_workers`` and suggest the smallest that keeps up.

    Args:
        dataloader: the user's training DataLoader; only read, never changed.
        compute_ms_per_batch: the model's measured compute time per batch; ``None`` suggests the smallest
            value within ``margin`` of the fastest instead.
        budget_s: total time for all candidates (loose: a batch in flight is finished).
        max_workers: largest ``num_workers`` to try; default the usable CPU cores.
        margin: how much faster than compute the delivery must be.
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

    counts = candidate_counts(usable_cpu_count() if max_workers is None else max_workers)
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
            candidates.append(result)
            rate = _slowest_rate(result)
            kept_up = target is not None and rate is not None and rate >= target * margin
            if kept_up:
                break  # the smallest value that keeps up is found; larger ones only cost budget
    suggested, reason = suggest_from_candidates(candidates, target, margin)
    if len(candidates) < len(counts) and not kept_up:
        reason += f"; the budget of {budget_s:g} s ran out before num_workers={counts[len(candidates)]}"
    if isinstance(dataloader.dataset, IterableDataset) and any(c["num_workers"] > 0 for c in candidates):
        reason += (
            "; IterableDataset: each worker replays the iterable unless the dataset shards itself "
            "(get_worker_info), so worker rates may count duplicate samples"
        )
    noisy = noisy_machine(RunSummary(machine=watch.finish()), None)
    note = ""
    if noisy is not None:
        note = noisy.evidence.removeprefix("During the run ").split(":")[0]
        reason += f"; measured on a busy machine ({note}): the rates may be off, repeat on a quiet machine"
    return NumWorkersProbe(candidates, target, suggested, reason, note)


def _slowest_rate(candidate: dict[str, Any]) -> float | None:
    """The candidate's rate a selection must clear: its slowest segment's, or its overall rate."""
    segments = candidate.get("segment_rates") or []
    return min(segments) if segments else candidate.get("batches_per_sec")


def _rate_text(candidate: dict[str, Any]) -> str:
    segments = candidate.get("segment_rates") or []
    text = f"{candidate['batches_per_sec']:.1f} batches/s"
    if len(segments) > 1:
        text += f" ({min(segments):.1f}-{max(segments):.1f} over {len(segments)} segments)"
    return text


def suggest_from_candidates(
    candidates: list[dict[str, Any]], compute_batches_per_sec: float | None, margin: float = DEFAULT_MARGIN
) -> tuple[int | None, str]:
    """The suggestion and its reason from measured candidates (in increasing ``num_workers``)."""
    measured = [c for c in candidates if c.get("batches_per_sec") is not None]
    if not measured:
        errors = sorted({c["error"] for c in candidates if c.get("error")})
        return None, "no candidate delivered batches" + (f": {'; '.join(errors)}" if errors else "")
    fastest = max(measured, key=lambda c: c["batches_per_sec"])
    if compute_batches_per_sec is None:
        line = fastest["batches_per_sec"] / margin
        pick = next(c for c in measured if c["batches_per_sec"] >= line)
        return pick["num_workers"], (
            f"no compute rate measured: num_workers={pick['num_workers']} delivers "
            f"{pick['batches_per_sec']:.1f} batches/s, within {margin:g}x of the fastest "
            f"({fastest['batches_per_sec']:.1f} batches/s with {fastest['num_workers']})"
        )
    needed = compute_batches_per_sec * margin
    pick = next((c for c in measured if (_slowest_rate(c) or 0.0) >= needed), None)
    if pick is not None:
        slowest = "even in its slowest segment, " if len(pick.get("segment_rates") or []) > 1 else ""
        return pick["num_workers"], (
            f"num_workers={pick['num_workers']} delivers {_rate_text(pick)}, {slowest}at least "
            f"{margin:g}x the model's {compute_batches_per_sec:.1f} batches/s"
        )
    return fastest["num_workers"], (
        f"the input pipeline cannot keep up: the fastest, num_workers={fastest['num_workers']}, delivers "
        f"{_rate_text(fastest)}, below {margin:g}x the model's {compute_batches_per_sec:.1f} batches/s"
    )


def candidate_counts(max_workers: int) -> list[int]:
    """0, 1, 2, 4, ... doubling up to ``max_workers``, which is always included."""
    counts, workers = [0], 1
    while workers <= max_workers:
        counts.append(workers)
        workers *= 2
    if counts[-1] != max_workers:
        counts.append(max_workers)
    return counts


def _measure(dataloader: DataLoader, workers: int, slice_s: float, remaining_s: float) -> dict[str, Any]:
    """Fetch from a copy with ``workers`` workers for ``slice_s``; restart the copy when the data runs out."""
    result: dict[str, Any] = {
        "num_workers": workers,
        "startup_ms": None,
        "batches_per_sec": None,
        "segment_rates": [],
        "batches": 0,
        "error": None,
    }
    steady_times: list[float] = []  # arrival times of the steady batches, to time the segments
    # batches the workers had ready when the first arrived: a burst, not the steady rate
    warmup = max(workers - 1, 0)
    start = time.perf_counter()
    end = start + slice_s
    steady_batches, steady_s = 0, 0.0
    iterator = None
    try:
        loader = _copy(dataloader, workers, timeout_s=max(remaining_s, MIN_WORKER_TIMEOUT_S))
        done = False
        while not done:
            iterator = iter(loader)
            fetched, clock_start, last = 0, None, start
            for _ in iterator:
                last = time.perf_counter()
                result["batches"] += 1
                if result["startup_ms"] is None:
                    result["startup_ms"] = (last - start) * 1000.0
                if fetched == warmup:
                    clock_start = last
                    steady_times.append(float("nan"))  # a new iterator: segments do not span the restart
                if fetched >= warmup:
                    steady_times.append(last)
                fetched += 1
                if last >= end or result["batches"] >= MAX_BATCHES_PER_CANDIDATE:
                    done = True
                    break
            if clock_start is not None and fetched > warmup + 1:
                steady_batches += fetched - warmup - 1
                steady_s += last - clock_start
            _shutdown(iterator)
            iterator = None
            if fetched == 0:
                raise RuntimeError("the DataLoader yielded no batches")
            done = done or time.perf_counter() >= end
    except Exception as err:  # a failing candidate is a result, never a crash of the training it watches
        result["error"] = f"{type(err).__name__}: {err}"
        return result
    finally:
        _shutdown(iterator)
    if steady_batches > 0 and steady_s > 0:
        result["batches_per_sec"] = steady_batches / steady_s
        result["segment_rates"] = segment_rates(steady_times, SEGMENTS)
    elif result["batches"] > 0:
        # too few batches for a steady rate: count the start-up in, which can only under-state the rate
        result["batches_per_sec"] = result["batches"] / max(time.perf_counter() - start, 1e-9)
    return result


def segment_rates(times: list[float], segments: int) -> list[float]:
    """Rates (batches/s) of ``segments`` consecutive stretches of batch arrival ``times``; ``nan`` marks a
    restart of the iterator, which no stretch spans. Fewer stretches when there are too few batches."""
    runs: list[list[float]] = [[]]
    for t in times:
        if math.isnan(t):
            runs.append([])
        else:
            runs[-1].append(t)
    intervals = [(run[i], run[i + 1]) for run in runs for i in range(len(run) - 1)]
    if len(intervals) < segments:
        return []
    size = len(intervals) // segments
    rates = []
    for k in range(segments):
        chunk = intervals[k * size : (k + 1) * size if k < segments - 1 else None]  # the last takes the rest
        elapsed = sum(end - start for start, end in chunk)
        if elapsed > 0:
            rates.append(len(chunk) / elapsed)
    return rates


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
