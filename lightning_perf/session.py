"""PerfSession: the measuring state of one run (a ``fit``, or one ``validate``/``test``/``predict`` call).

It is the listener of the instrumented data fetcher (``fetcher.py``): on every batch boundary it ends the
previous step on the :class:`~lightning_perf.timing.StepClock` and steps the
:class:`~lightning_perf.profiling.ProfilerWindow`; after the fetch it starts the new step with its DataLoader
wait and batch size. It holds no Lightning objects, so the callback stays a thin layer of hooks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from lightning_perf.profiling import ProfilerWindow
from lightning_perf.timing import StepClock

# distinct input shapes remembered; beyond the full batch and a smaller last batch, shapes "vary"
_MAX_SHAPES = 8
_CONSTANT_SHAPES = 2


def first_tensor(batch: Any, _depth: int = 0) -> torch.Tensor | None:
    """The first tensor in a (nested) batch, looked up cheaply: it is done for every batch."""
    if isinstance(batch, torch.Tensor):
        return batch
    if _depth > 4:
        return None
    if isinstance(batch, (list, tuple)):
        for item in batch:
            found = first_tensor(item, _depth + 1)
            if found is not None:
                return found
    elif isinstance(batch, Mapping):
        for item in batch.values():
            found = first_tensor(item, _depth + 1)
            if found is not None:
                return found
    return None


class PerfSession:
    """Listener of one run's data fetcher; see the module docstring."""

    def __init__(
        self,
        stage: str,
        clock: StepClock,
        window: ProfilerWindow | None,
        batch_size: int | None = None,
    ) -> None:
        self.stage = stage
        self.clock = clock
        self.window = window
        self.batch_size_override = batch_size
        self.batches = 0  # batches started so far: the schedule's step counter
        self.shapes: set[tuple[int, ...]] = set()
        self.batch_size_seen: int | None = None
        self._last_shape: torch.Size | None = None
        self.kernel_busy_pct: list[float] = []  # per profiled cycle with CUDA activity

    # -- fetcher listener --------------------------------------------------------------------------------

    def before_fetch(self, t: float) -> None:
        self.clock.fetch_started(t)
        step = self.batches
        self.batches = step + 1
        if self.window is not None:
            self.window.boundary(step)

    def after_fetch(self, t_start: float, t_end: float, fetched: Any) -> None:
        self.clock.fetch_finished(t_start, t_end, self._batch_size(fetched))

    def fetch_stopped(self) -> None:
        self.clock.fetch_stopped()

    def iterator_created(self, seconds: float) -> None:
        self.clock.iterator_created(seconds)

    # -- batch inspection --------------------------------------------------------------------------------

    @property
    def input_shapes_vary(self) -> bool | None:
        if not self.shapes:
            return None
        return len(self.shapes) > _CONSTANT_SHAPES

    def _batch_size(self, fetched: Any) -> int | None:
        # Lightning's fetchers return (batch, batch_idx, dataloader_idx)
        batch = fetched[0] if type(fetched) is tuple and len(fetched) == 3 else fetched
        tensor = first_tensor(batch)
        if tensor is None:
            return self.batch_size_override
        shape = tensor.shape
        if shape != self._last_shape:
            self._last_shape = shape
            if len(self.shapes) < _MAX_SHAPES:
                self.shapes.add(tuple(shape))
        if self.batch_size_override is not None:
            return self.batch_size_override
        if not shape:
            return None
        size = shape[0]
        self.batch_size_seen = max(size, self.batch_size_seen or 0)
        return size
