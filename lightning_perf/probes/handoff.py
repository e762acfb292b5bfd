"""What one batch of the run's own DataLoader costs to hand over from a worker process, measured.

A batch a DataLoader worker makes is pickled (its tensors moved into shared memory), passed through a
multiprocessing queue and rebuilt by the training process: a fixed cost per batch plus one per byte, paid whatever
the loading itself costs. With 0 workers there is no hand-off, so a loader whose fetch is cheaper than the
hand-off is slower with workers (in-memory tensors: 0.72 ms steps became 3.2 ms with one worker).

:func:`measure_handoff` takes one batch of the user's loader (fetched in this process from a throw-away copy with
0 workers, the random state kept) and replays it through a DataLoader with one worker whose dataset only returns
that batch: the loading costs nothing, so the steady time per batch delivered is the hand-off alone
(``ms_per_batch``, the worker's pickling and the queue as well as this process's share). ``main_ms`` is this
thread's CPU time per batch received (unpickling, rebuilding the tensors): the part no number of workers takes
off the training thread. No torch API reports this cost; hence a timed replay. Before it, the next few batches of
the 0-worker copy are timed too (``load_ms``): the loading's own cost, which the hand-off is weighed against.

The caller runs it outside timed steps, within a small budget; a failure is a result (``error``), never a crash.
Uses torch's DataLoader, nothing from Lightning.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from lightning_perf.analysis.probe_results import HandOff
from lightning_perf.probes.loader_copy import copy_loader, preserved_random_state

DEFAULT_BUDGET_S = 0.3
# Batches delivered before the clock starts: the worker's start-up and the prefetch burst it fills
# (prefetch_factor=2 batches in flight) are not the steady hand-off.
WARMUP_BATCHES = 3
# Enough batches for a steady figure on fast hand-offs; large batches stop at the budget first.
MAX_BATCHES = 24
MIN_TIMED_BATCHES = 4
# Batches fetched in this process after the first to time the loading itself (half the budget at most).
LOAD_BATCHES = 6
LOAD_WARMUP_BATCHES = 2
PAGE_BYTES = 4096
# A worker that has not delivered in this long is stuck: the measurement ends as an error.
TIMEOUT_S = 10.0


class _Replay(Dataset):
    """A dataset of ``length`` copies of one batch: a worker's loading then costs nothing but the hand-off."""

    def __init__(self, batch: Any, length: int) -> None:
        self.batch, self.length = batch, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Any:
        return in_fresh_shared_memory(self.batch)


def in_fresh_shared_memory(batch: Any) -> Any:
    """The batch with each tensor copied into new shared memory, as ``default_collate`` writes a worker's batch:
    each hand-off then pays for its own shared memory (a batch already in shared memory passes as a handle)."""
    if isinstance(batch, torch.Tensor):
        storage = batch._typed_storage()._new_shared(batch.numel(), device=batch.device)
        return batch.new(storage).resize_(batch.shape).copy_(batch)
    if isinstance(batch, dict):
        return {key: in_fresh_shared_memory(value) for key, value in batch.items()}
    if isinstance(batch, list):
        return [in_fresh_shared_memory(value) for value in batch]
    if isinstance(batch, tuple) and not hasattr(batch, "_fields"):
        return tuple(in_fresh_shared_memory(value) for value in batch)
    return batch  # named tuples and other objects pass as they are


def _identity(batch: Any) -> Any:
    return batch


def tensors_of(batch: Any) -> list[torch.Tensor]:
    """Every tensor a batch holds (in lists, tuples, dicts and dataclass-like objects' attributes)."""
    found: list[torch.Tensor] = []
    stack, seen = [batch], 0
    while stack and seen < 10_000:  # a bound for self-referencing objects
        item, seen = stack.pop(), seen + 1
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif hasattr(item, "__dict__") and not isinstance(item, type):
            stack.extend(vars(item).values())
    return found


def measure_handoff(dataloader: DataLoader, budget_s: float = DEFAULT_BUDGET_S) -> HandOff:
    """Time the hand-off of one batch of ``dataloader`` through one worker (see the module's docstring)."""
    result = HandOff()
    try:
        with preserved_random_state(dataloader), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*(worker|pin_memory).*", category=UserWarning)
            iterator = iter(copy_loader(dataloader, 0, timeout_s=TIMEOUT_S))
            batch = next(iterator)
            _time_loading(iterator, budget_s / 2, result)
            del iterator
            tensors = tensors_of(batch)
            result.tensors = len(tensors)
            result.batch_bytes = sum(t.numel() * t.element_size() for t in tensors)
            _time_replay(dataloader, batch, budget_s, result)
    except Exception as err:  # a failed measurement is a result, never a crash of the run it watches
        result.ms_per_batch = result.main_ms = None
        result.error = f"{type(err).__name__}: {err}"
    return result


def touch_pages(batch: Any) -> None:
    """Read one value of every page of the batch's tensors: a received batch's shared memory is mapped lazily, so
    the training step's first reads fault each page in, a cost of the hand-off that 0 workers never pay."""
    for tensor in tensors_of(batch):
        if tensor.numel() and tensor.is_contiguous() and tensor.device.type == "cpu":
            flat = tensor.reshape(-1)
            flat[:: max(1, PAGE_BYTES // tensor.element_size())].sum()


def _time_loading(iterator: Any, budget_s: float, result: HandOff) -> None:
    """The loading's own cost: batches fetched in this process (0 workers) after the first, each timed; the first
    ``LOAD_WARMUP_BATCHES`` of them are left out where later ones were timed (the allocator's first requests for
    a batch's memory fault it in: 30 ms against 14 ms for a 12.6 MB batch here)."""
    start, times = time.perf_counter(), list[float]()
    while len(times) < LOAD_WARMUP_BATCHES + LOAD_BATCHES and (
        not times or time.perf_counter() < start + budget_s
    ):
        began = time.perf_counter()
        try:
            next(iterator)
        except StopIteration:
            break
        times.append(time.perf_counter() - began)
    steady = times[LOAD_WARMUP_BATCHES:] or times
    if steady:
        result.load_ms = sum(steady) * 1e3 / len(steady)
        result.load_batches = len(steady)


def _time_replay(dataloader: DataLoader, batch: Any, budget_s: float, result: HandOff) -> None:
    replay = DataLoader(
        _Replay(batch, MAX_BATCHES + WARMUP_BATCHES),
        batch_size=None,
        collate_fn=_identity,
        num_workers=1,
        pin_memory=dataloader.pin_memory,
        timeout=TIMEOUT_S,
        multiprocessing_context=dataloader.multiprocessing_context,
    )
    deadline = time.perf_counter() + budget_s
    iterator = iter(replay)
    try:
        wall_start = cpu_start = None
        timed = 0
        touch_s = 0.0
        for index, received in enumerate(iterator):
            touch_start = time.thread_time()
            touch_pages(received)
            now = time.perf_counter()
            if index + 1 == WARMUP_BATCHES:
                wall_start, cpu_start = now, time.thread_time()
                continue
            if wall_start is None:
                continue
            touch_s += time.thread_time() - touch_start
            timed += 1
            if timed >= MIN_TIMED_BATCHES and now >= deadline:
                break
        if wall_start is None or cpu_start is None or timed < 1:
            raise RuntimeError(f"too few batches for a figure ({timed} timed)")
        wall_ms = (time.perf_counter() - wall_start) * 1e3
        cpu_ms = (time.thread_time() - cpu_start) * 1e3
        result.batches = timed
        result.ms_per_batch = wall_ms / timed
        result.main_ms = min(cpu_ms, wall_ms) / timed
        result.touch_ms = min(touch_s * 1e3, cpu_ms) / timed
    finally:
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
