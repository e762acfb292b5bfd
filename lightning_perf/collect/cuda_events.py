"""The GPU side of the step clock: CUDA events at every batch boundary, read without ever synchronizing.

The DataLoader wait the step clock measures is host time. When nothing syncs per step (no ``.item()``, bf16
with no loss scaling) the host runs ahead of the GPU, and a fetch that happens while queued kernels still run
costs the GPU nothing, yet counts as wait on the host. The GPU's own account needs no sync: record an event
on the current stream before each fetch (``boundary``) and after it (``fetched``). An event completes when
the GPU has done everything queued before it, so

- from ``boundary`` to ``fetched``: the time the GPU had nothing to do because the host was fetching;
- from ``fetched`` to the next ``boundary``: the GPU time of one step (its kernels, and any gap the host
  left inside the step).

Events are read when a logging window is flushed, only those the GPU has already reached (``query()``):
the others wait for a later window, and the end of the run drains the rest with one sync. Events are pooled
and reused; an unread backlog longer than :data:`MAX_PENDING` marks drops its oldest marks.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable
from typing import Any

from lightning_perf.analysis import metrics

# metric tags, logged per window beside the host-side ones (see docs/metrics.md)
GPU_DATA_WAIT_MS = metrics.GPU_DATA_WAIT.tag
GPU_DATA_WAIT_PCT = metrics.GPU_DATA_WAIT_PCT.tag
GPU_COMPUTE_MS = metrics.GPU_COMPUTE.tag

# Marks in the order they are recorded; what lies between two consecutive marks:
BOUNDARY = 0  # before a fetch: the previous step's work is queued
START = 1  # after a fetch: a measured step starts (BOUNDARY -> START is the GPU's idle time in the fetch)
START_UNMEASURED = 2  # after an epoch's first fetch (worker start-up): neither the fetch nor the step counts
END = 3  # validation, a checkpoint or the epoch end interrupts the open step (START -> END is its GPU time)
_IDLE_PAIRS = {(BOUNDARY, START)}
_STEP_PAIRS = {(START, BOUNDARY), (START, END)}
# Marks not yet read. Two per step: 4096 holds 2048 steps, far more than any GPU queues ahead of its host
# (CUDA's launch queue holds ~1000 kernels); past it the host is recording marks no one reads. Our choice.
MAX_PENDING = 4096


def _cuda_event() -> Any:
    import torch

    return torch.cuda.Event(enable_timing=True)


class CudaStepEvents:
    """Records and reads the marks; ``event_factory`` makes an event (tests pass a fake with the same
    ``record``/``query``/``elapsed_time``/``synchronize`` methods as ``torch.cuda.Event``)."""

    def __init__(self, event_factory: Callable[[], Any] = _cuda_event) -> None:
        self._new_event = event_factory
        self._pool: list[Any] = []
        self._pending: deque[tuple[int, Any]] = deque()
        self._last: tuple[int, Any] | None = None  # the newest mark already read: the start of the next pair
        self._open = False  # a step has started and not been closed by a boundary or an interrupt
        self.idle_ms = array("d")
        self.step_ms = array("d")
        self._window_idle = 0
        self._window_step = 0

    @classmethod
    def for_device(cls, device: Any) -> CudaStepEvents | None:
        """Events for a training device; None off CUDA."""
        import torch

        if getattr(device, "type", None) != "cuda" or not torch.cuda.is_available():
            return None
        return cls()

    # -- recording: a few microseconds each, no sync -------------------------------------------------------

    def _mark(self, kind: int) -> None:
        event = self._pool.pop() if self._pool else self._new_event()
        event.record()
        pending = self._pending
        pending.append((kind, event))
        if len(pending) > MAX_PENDING:
            self._release(pending.popleft()[1])
            self._last = None  # the pair across the dropped mark is unknown

    def boundary(self) -> None:
        self._mark(BOUNDARY)
        self._open = False

    def fetched(self, measured: bool) -> None:
        self._mark(START if measured else START_UNMEASURED)
        self._open = True

    def interrupt(self) -> None:
        if self._open:
            self._mark(END)
            self._open = False

    # -- reading -------------------------------------------------------------------------------------------

    def read_completed(self) -> None:
        """Turn the marks the GPU has passed into idle and step times; the rest wait (no sync)."""
        pending = self._pending
        while pending and pending[0][1].query():
            mark = pending.popleft()
            last = self._last
            if last is not None:
                pair = (last[0], mark[0])
                if pair in _IDLE_PAIRS:
                    self.idle_ms.append(last[1].elapsed_time(mark[1]))
                elif pair in _STEP_PAIRS:
                    self.step_ms.append(last[1].elapsed_time(mark[1]))
                self._release(last[1])
            self._last = mark

    def drain(self) -> None:
        """Wait for the newest mark (one sync, at the end of the run) and read everything."""
        if self._pending:
            self._pending[-1][1].synchronize()
        self.read_completed()

    def _release(self, event: Any) -> None:
        self._pool.append(event)

    def take_window(self) -> dict[str, float]:
        """Means over what was read since the last call (after reading what completed)."""
        self.read_completed()
        idle, step = self.idle_ms[self._window_idle :], self.step_ms[self._window_step :]
        self._window_idle, self._window_step = len(self.idle_ms), len(self.step_ms)
        return self._figures(idle, step)

    def run_figures(self) -> dict[str, float]:
        return self._figures(self.idle_ms, self.step_ms)

    @staticmethod
    def _figures(idle: array, step: array) -> dict[str, float]:
        if not idle or not step:
            return {}
        idle_mean, step_mean = sum(idle) / len(idle), sum(step) / len(step)
        total = idle_mean + step_mean
        figures = {GPU_DATA_WAIT_MS: idle_mean, GPU_COMPUTE_MS: step_mean}
        if total > 0:
            figures[GPU_DATA_WAIT_PCT] = 100.0 * idle_mean / total
        return figures
