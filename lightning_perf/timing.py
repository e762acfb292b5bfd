"""StepClock: DataLoader wait, step time, compute and throughput of every training batch.

The callback feeds it timestamps (``time.perf_counter()`` seconds) taken around the training loop's own
``next(data_fetcher)`` call, the exact place the loop blocks on the DataLoader:

* ``fetch_started(t)`` – a batch boundary: the previous step ends here.
* ``fetch_finished(t_start, t_end, samples)`` – the fetch returned; a new step starts at ``t_start`` and
  its DataLoader wait is ``t_end - t_start``.
* ``interrupt(t, kind)`` – validation, a checkpoint or the epoch end begins: the open step ends here and the
  time until the next fetch is charged to ``kind``, not to a step.
* ``exclude(seconds)`` – the callback's own work inside a step (e.g. logging a window) is left out of it.

The first fetch of every epoch (iterator creation, worker start-up) is reported apart as
``epoch_start_ms`` and that batch is left out of the per-step figures. Steps are aggregated per logging
window (means) and per run (median, p90). No Lightning import; no device synchronisation.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

from lightning_perf.summary import Distribution, TimingSummary

# metric tags, logged per window (see README "Logged metrics")
STEP_TIME_MS = "perf/step_time_ms"
DATA_WAIT_MS = "perf/data_wait_ms"
DATA_WAIT_PCT = "perf/data_wait_pct"
COMPUTE_MS = "perf/compute_ms"
SAMPLES_PER_SEC = "perf/samples_per_sec"
BATCHES_PER_SEC = "perf/batches_per_sec"
EPOCH_START_MS = "perf/epoch_start_ms"


@dataclass
class _Window:
    steps: int = 0
    step_s: float = 0.0
    wait_s: float = 0.0
    samples: int = 0
    samples_known: bool = True


class StepClock:
    """Accumulates per-step timings; see the module docstring for the protocol."""

    def __init__(self, measure_data_wait: bool = True) -> None:
        # False when training_step fetches its own batches (``dataloader_iter``): the wait is not observable
        self.measure_data_wait = measure_data_wait
        self._open_start: float | None = None
        self._open_wait = 0.0
        self._open_samples: int | None = None
        self._open_excluded = 0.0
        self._epoch_first = False
        self._pending_iter_s = 0.0
        self._gap_kind: str | None = None
        self._gap_start = 0.0
        self._window = _Window()
        self._step_ms = array("d")
        self._wait_ms = array("d")
        self._epoch_start_ms = array("d")
        self._samples = 0
        self._samples_known = True
        self._sum_step_s = 0.0
        self._sum_wait_s = 0.0
        self.epochs = 0
        self.gap_s: dict[str, float] = {}
        self.last_epoch_start_ms: float | None = None

    # -- the protocol ------------------------------------------------------------------------------------

    def epoch_started(self) -> None:
        """A training epoch begins: its first fetch is start-up, not a per-batch wait."""
        self._epoch_first = True
        self._pending_iter_s = 0.0
        self.epochs += 1

    def iterator_created(self, seconds: float) -> None:
        """``iter()`` on the loader took ``seconds`` (worker start-up); part of the epoch start."""
        self._pending_iter_s += seconds

    def fetch_started(self, t: float) -> None:
        self._settle_gap(t)
        if self._open_start is not None:
            self._close(t)

    def fetch_finished(self, t_start: float, t_end: float, samples: int | None) -> None:
        if self._epoch_first:
            self._epoch_first = False
            start_ms = (self._pending_iter_s + t_end - t_start) * 1e3
            self._epoch_start_ms.append(start_ms)
            self.last_epoch_start_ms = start_ms
            return  # the epoch's first batch is not a representative step
        self._open_start = t_start
        self._open_wait = t_end - t_start
        self._open_samples = samples
        self._open_excluded = 0.0

    def fetch_stopped(self) -> None:
        """The fetch raised StopIteration: no step starts."""
        self._epoch_first = False

    def interrupt(self, t: float, kind: str | None = None) -> None:
        """Close the open step at ``t``; charge the time until the next step to ``kind``."""
        self._settle_gap(t)
        if self._open_start is not None:
            self._close(t)
        if kind is not None:
            self._gap_kind = kind
            self._gap_start = t

    def settle(self, t: float) -> None:
        """End a gap opened by :meth:`interrupt` (e.g. validation ended) at ``t``."""
        self._settle_gap(t)

    def exclude(self, seconds: float) -> None:
        if self._open_start is not None:
            self._open_excluded += seconds

    # -- results -----------------------------------------------------------------------------------------

    @property
    def window_steps(self) -> int:
        return self._window.steps

    @property
    def steps(self) -> int:
        return len(self._step_ms)

    def take_window(self) -> dict[str, float]:
        """Window metrics (means over the steps closed since the last call); resets the window."""
        window, self._window = self._window, _Window()
        if window.steps == 0 or window.step_s <= 0.0:
            return {}
        metrics = {
            STEP_TIME_MS: window.step_s / window.steps * 1e3,
            BATCHES_PER_SEC: window.steps / window.step_s,
        }
        if self.measure_data_wait:
            metrics[DATA_WAIT_MS] = window.wait_s / window.steps * 1e3
            metrics[DATA_WAIT_PCT] = window.wait_s / window.step_s * 100.0
            metrics[COMPUTE_MS] = (window.step_s - window.wait_s) / window.steps * 1e3
        if window.samples_known:
            metrics[SAMPLES_PER_SEC] = window.samples / window.step_s
        return metrics

    def summary(self, train_wall_s: float = 0.0) -> TimingSummary:
        steps = len(self._step_ms)
        summary = TimingSummary(
            steps=steps,
            samples=self._samples if self._samples_known else 0,
            step_time_ms=Distribution.of(self._step_ms),
            epoch_start_ms=Distribution.of(self._epoch_start_ms),
            epochs=self.epochs,
            validation_s=self.gap_s.get("validation", 0.0),
            checkpoint_s=self.gap_s.get("checkpoint", 0.0),
            train_wall_s=train_wall_s,
        )
        if steps and self._sum_step_s > 0.0:
            summary.batches_per_sec = steps / self._sum_step_s
            if self._samples_known:
                summary.samples_per_sec = self._samples / self._sum_step_s
            if self.measure_data_wait:
                summary.data_wait_ms = Distribution.of(self._wait_ms)
                summary.compute_ms = Distribution.of(
                    [s - w for s, w in zip(self._step_ms, self._wait_ms, strict=True)]
                )
                summary.data_wait_pct = self._sum_wait_s / self._sum_step_s * 100.0
        return summary

    # -- internals ---------------------------------------------------------------------------------------

    def _close(self, t_end: float) -> None:
        step_s = t_end - self._open_start - self._open_excluded
        wait_s = min(self._open_wait, step_s)
        self._open_start = None
        if step_s <= 0.0:
            return
        self._step_ms.append(step_s * 1e3)
        self._wait_ms.append(wait_s * 1e3)
        self._sum_step_s += step_s
        self._sum_wait_s += wait_s
        window = self._window
        window.steps += 1
        window.step_s += step_s
        window.wait_s += wait_s
        samples = self._open_samples
        if samples is None:
            window.samples_known = False
            self._samples_known = False
        else:
            window.samples += samples
            self._samples += samples

    def _settle_gap(self, t: float) -> None:
        if self._gap_kind is not None:
            self.gap_s[self._gap_kind] = self.gap_s.get(self._gap_kind, 0.0) + (t - self._gap_start)
            self._gap_kind = None
