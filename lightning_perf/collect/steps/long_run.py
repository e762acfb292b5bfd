"""What a long run needs at each logging window: the online slowdown check and the extra profiler cycles.

Called from the window flush (:func:`lightning_perf.output.windows.flush`) with the window's figures, so it
costs nothing per batch: one point appended to the change-point detector
(:mod:`lightning_perf.analysis.changepoint`) and one ``stat`` for a capture request
(:mod:`lightning_perf.collect.profiling.capture_request`). Rank zero decides, from the figures gathered over all ranks,
and the decision reaches every rank through the cross-rank exchange, so under DDP every rank records the extra
cycle at the same batch. Extra cycles are named ``<worker>_slowdown`` and ``<worker>_capture``, stay within
``max_trace_mb``, and at most :data:`MAX_SLOWDOWN_CYCLES` are recorded for slowdowns in one run.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from lightning_perf import console
from lightning_perf.analysis import metrics
from lightning_perf.analysis.changepoint import Slowdown, SlowdownDetector, WindowPoint
from lightning_perf.collect.profiling.capture_request import RequestInbox

if TYPE_CHECKING:
    from lightning_perf.collect.config import PerfConfig
    from lightning_perf.collect.profiling.profiler_window import ProfilerWindow
    from lightning_perf.collect.rank_exchange import RankReducer

log = console.logger(__name__)

# Slowdown traces per run: the first slowdowns are the ones worth a trace; a run slowing again and again
# would otherwise fill max_trace_mb with the same picture.
MAX_SLOWDOWN_CYCLES = 3
NONE, SLOWDOWN, CAPTURE = 0, 1, 2
LABELS = {SLOWDOWN: "slowdown", CAPTURE: "capture"}


class LongRunWatch:
    """One fit's detector and request inbox; :meth:`at_window` at every logging window, on every rank."""

    def __init__(self, config: PerfConfig, run_dir: str | None, global_rank: int) -> None:
        self.detector = SlowdownDetector()
        self.inbox = RequestInbox(run_dir, time.time())
        self.profile_on_slowdown = config.profile_on_slowdown
        self.zero = global_rank == 0
        self.slowdown_cycles = 0
        self._pending = NONE
        self._last_batch = 0

    @property
    def slowdowns(self) -> list[Slowdown]:
        return self.detector.slowdowns

    def at_window(
        self,
        figures: Mapping[str, float],
        step: int,
        window: ProfilerWindow | None,
        next_batch: int,
        reducer: RankReducer | None,
    ) -> list[str]:
        """Look at the window that ended at global ``step``; returns the events to log (rank zero).

        ``reducer`` is given when every rank flushes here together: the decision is then shared (a collective).
        ``next_batch`` is the batch an extra cycle would start at.
        """
        events: list[str] = []
        code = NONE
        window_batches, self._last_batch = next_batch - self._last_batch, next_batch
        if self.zero:
            try:  # never raise before the collective below: the other ranks would wait in it
                code = self._decide(figures, step, window_batches, window, events)
            except Exception as err:
                log.warning(f"lightning-perf: the slowdown check failed at step {step}: {err}")
        if reducer is not None:
            code = reducer.share(code)
        elif not self._single_process():
            code = NONE  # ranks not flushing together cannot start a cycle together
        if code == NONE or window is None:
            return events
        if window.request_cycle(next_batch, LABELS[code]):
            self._pending = NONE
            if code == SLOWDOWN:
                self.slowdown_cycles += 1
                if self.detector.slowdowns:  # rank zero's (the others do not run the detector)
                    self.detector.slowdowns[-1].cycle_batch = next_batch
            events.append(
                f"lightning-perf: recording one extra profiler cycle ({LABELS[code]}) from batch {next_batch}: "
                f"trace {window.worker}_{LABELS[code]}.*.pt.trace.json.gz in {window.trace_dir}"
            )
        elif window.active:
            self._pending = code  # a scheduled cycle is running: the next window asks again
        else:
            self._pending = NONE
            events.append(
                f"lightning-perf: no extra profiler cycle ({LABELS[code]}): this run's profiling has ended (the "
                "run ended, max_trace_mb was reached or a trace could not be written)"
            )
        return events if self.zero else []

    def _decide(
        self,
        figures: Mapping[str, float],
        step: int,
        batches: int,
        window: ProfilerWindow | None,
        events: list[str],
    ) -> int:
        code, self._pending = self._pending, NONE
        found = self._add(figures, step, batches)
        if found is not None:
            events.append(describe(found))
            if self.profile_on_slowdown and self.slowdown_cycles < MAX_SLOWDOWN_CYCLES:
                code = code or SLOWDOWN
        if self.inbox.take() is not None:
            if window is None:
                events.append(
                    "lightning-perf: capture requested, but `enable_profiler=False`: nothing to record"
                )
            else:
                events.append(f"lightning-perf: capture requested ({self.inbox.path})")
                code = CAPTURE
        return code

    def _add(self, figures: Mapping[str, float], step: int, steps: int) -> Slowdown | None:
        """``steps``: the batches of the window (its weight); ``step``: the global step it ended at."""
        step_ms = figures.get(metrics.STEP_TIME.tag)
        if step_ms is None or steps <= 0:
            return None
        return self.detector.add(
            WindowPoint(
                end_step=step,
                steps=steps,
                step_ms=float(step_ms),
                wait_ms=figures.get(metrics.DATA_WAIT.tag),
                compute_ms=figures.get(metrics.COMPUTE.tag),
            )
        )

    @staticmethod
    def _single_process() -> bool:
        import torch

        dist = torch.distributed
        return not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


def describe(found: Slowdown) -> str:
    """One line for the console and TensorBoard's event text."""
    parts = []
    if found.before_wait_ms is not None and found.after_wait_ms is not None:
        parts.append(f"DataLoader wait {found.after_wait_ms - found.before_wait_ms:+.1f} ms")
    if found.before_compute_ms is not None and found.after_compute_ms is not None:
        parts.append(f"compute {found.after_compute_ms - found.before_compute_ms:+.1f} ms")
    split = f": {', '.join(parts)}" if parts else ""
    return (
        f"lightning-perf: lasting slowdown from step {found.step}: the mean step rose {found.before_ms:.1f} -> "
        f"{found.after_ms:.1f} ms ({found.ratio:.2f}x, 95% interval {found.low:.2f}-{found.high:.2f}x){split}"
    )
