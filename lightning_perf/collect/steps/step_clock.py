"""StepClock: DataLoader wait, step time, compute and throughput of every training batch.

The callback feeds it timestamps (``time.perf_counter()`` seconds) taken around the training loop's own
``next(data_fetcher)`` call, the exact place the loop blocks on the DataLoader:

* ``batch(t_boundary, t_start, t_end, samples)`` – a batch was fetched: the previous step ended at the
  boundary ``t_boundary``, the new one starts at ``t_start`` (after the callback's own work at the boundary)
  and its DataLoader wait is ``t_end - t_start``. One call per batch: this runs on every training step.
* ``fetch_stopped(t)`` – the fetch raised StopIteration at the boundary ``t``: no step starts.
* ``interrupt(t, kind)`` – validation, a checkpoint or the epoch end begins: the open step ends here and the
  time until the next fetch is charged to ``kind``, not to a step.
* ``exclude(seconds)`` – the callback's own work inside a step (e.g. logging a window) is left out of it.
* ``drop_open()`` – the open step is left out entirely (a ``torch.compile`` compilation ran in it, or its FLOPs
  were counted).

The hook profiler of the step's anatomy (``hooks``) is told of every batch that is no step here (the epoch's
first, a dropped one) and of every interrupt, so the anatomy's batches are the steps timed here.

The first fetch of every epoch (iterator creation, worker start-up) is reported apart as
``epoch_start_ms`` and that batch is left out of the per-step figures, except in a loop whose epochs are one
batch long (a library that yields whole series and samples its windows inside ``training_step``, as
neuralforecast does): when the first epoch ended with no step but its first batch, each later epoch's first
batch is a step (until an epoch has more batches), its start-up (iterator creation and fetch) its DataLoader
wait, since every step of such a loop pays it; the per-batch path is unchanged. Steps are aggregated per logging
window (means) and per run (median with its interval, p10, p90). The summary keeps up to
``MAX_SAMPLES`` per-step samples (evenly thinned) for the tests ``compare`` runs on them. The arrays here hold
24 bytes a step, up to :data:`~lightning_perf.collect.steps.step_history.EXACT_STEPS` steps; past that, each logging
window folds them into a quantile sketch (:mod:`lightning_perf.collect.steps.step_history`), so memory stays flat
over ten million steps. No Lightning import; no device synchronisation.

On CUDA a :class:`~lightning_perf.collect.cuda_events.CudaStepEvents` rides along (``gpu``): the same
protocol records CUDA events (``gpu_boundary()`` is called before each fetch), and the windows and the summary
gain the GPU's own idle time during the fetch and its time per step.
"""

from __future__ import annotations

from array import array
from typing import Protocol

from lightning_perf.analysis import metrics
from lightning_perf.analysis.summary import Distribution, TimingSummary, thinned
from lightning_perf.analysis.verdicts.mean_intervals import share_interval
from lightning_perf.collect.cuda_events import GPU_DATA_WAIT_PCT, CudaStepEvents
from lightning_perf.collect.steps.step_history import (
    EXACT_STEPS,
    SKETCH_RELATIVE_ACCURACY,
    FoldedSteps,
    StepQuantiles,
)

# metric tags, logged per window (lightning_perf.analysis.metrics has their units and meanings)
STEP_TIME_MS = metrics.STEP_TIME.tag
DATA_WAIT_MS = metrics.DATA_WAIT.tag
DATA_WAIT_PCT = metrics.DATA_WAIT_PCT.tag
COMPUTE_MS = metrics.COMPUTE.tag
SAMPLES_PER_SEC = metrics.SAMPLES_PER_SEC.tag
BATCHES_PER_SEC = metrics.BATCHES_PER_SEC.tag
EPOCH_START_MS = metrics.EPOCH_START.tag


class HookSpans(Protocol):
    """What the step clock tells the hook profiler (collect.steps.hook_profiler), so that the step's anatomy
    covers the steps this clock timed and nothing else."""

    def exclude(self, seconds: float) -> None: ...

    def drop_batch(self) -> None: ...

    def drop_closed(self) -> None: ...

    def interrupted(self) -> None: ...


class StepClock:
    """Accumulates per-step timings; see the module docstring for the protocol."""

    def __init__(self, measure_data_wait: bool = True, gpu: CudaStepEvents | None = None) -> None:
        # False when training_step fetches its own batches (``dataloader_iter``): the wait is not observable
        self.measure_data_wait = measure_data_wait
        self.gpu = gpu if measure_data_wait else None
        self._open_start: float | None = None
        self._open_wait = 0.0
        self._open_samples = -1
        self._epoch_first = False
        self._pending_iter_s = 0.0
        self._gap_kind: str | None = None
        self._gap_start = 0.0
        # one entry per closed step; a window is the tail of these arrays since ``_window_start``
        self._step_ms = array("d")
        self._wait_ms = array("d")
        self._samples = array("q")  # -1: the batch size was not found
        self._window_start = 0
        self._folded = FoldedSteps()  # the steps before the arrays' first, once a long run passed EXACT_STEPS
        self.window_steps = (
            0  # steps closed since the window started: read after every batch, so kept as a count
        )
        self._epoch_start_ms = array("d")
        self.epochs = 0
        self._epoch_steps_from = 0  # the step count when the current epoch began, while epochs are one batch
        # the epochs are one batch long: an epoch's first batch is a step (decided at each epoch's start)
        self.one_batch_epochs = False
        self.gap_s: dict[str, float] = {}
        self.last_epoch_start_ms: float | None = None
        # the hook profiler of the step's anatomy (collect.steps.hook_profiler), told of the steps left out
        self.hooks: HookSpans | None = None

    # -- the protocol ------------------------------------------------------------------------------------

    def epoch_started(self) -> None:
        """A training epoch begins: its first fetch is start-up, not a per-batch wait, unless the epochs are one
        batch long (the first closed no step but its first batch, and none since had more)."""
        steps = self.steps
        if self.epochs and self._epoch_steps_from >= 0:
            self.one_batch_epochs = steps - self._epoch_steps_from <= int(self.one_batch_epochs)
        # -1 once an epoch had steps beyond its first batch: a short epoch after it is a short epoch
        self._epoch_steps_from = steps if not self.epochs or self.one_batch_epochs else -1
        self._epoch_first = True
        self._pending_iter_s = 0.0
        self.epochs += 1

    def iterator_created(self, seconds: float) -> None:
        """``iter()`` on the loader took ``seconds`` (worker start-up); part of the epoch start."""
        self._pending_iter_s += seconds

    def gpu_boundary(self) -> None:
        """Before a fetch: the GPU mark of the boundary (nothing off CUDA)."""
        if self.gpu is not None:
            self.gpu.boundary()

    def batch(self, t_boundary: float, t_start: float, t_end: float, samples: int | None) -> None:
        # This runs on every step: the common case is one test of the three rare conditions, _close and three
        # stores.
        if self._gap_kind is not None or self._epoch_first or self.gpu is not None:
            if not self._irregular_batch(t_boundary, t_start, t_end, samples):
                return
        elif self._open_start is not None:
            self._close(t_boundary)
        self._open_start = t_start
        self._open_wait = t_end - t_start
        self._open_samples = -1 if samples is None else samples  # -1: the batch size was not found

    def _irregular_batch(self, t_boundary: float, t_start: float, t_end: float, samples: int | None) -> bool:
        """:meth:`batch` after a gap, at an epoch's first fetch or with GPU marks; False: no step opens here
        (none, or the one-batch epoch's, opened by this method)."""
        self._settle_gap(t_boundary)
        if self._open_start is not None:
            self._close(t_boundary)
        if self.gpu is not None:
            self.gpu.fetched(measured=not self._epoch_first or self.one_batch_epochs)
        if self._epoch_first:
            self._epoch_first = False
            start_s = self._pending_iter_s + t_end - t_start
            self._epoch_start_ms.append(start_s * 1e3)
            self.last_epoch_start_ms = start_s * 1e3
            if self.one_batch_epochs:  # the batch is the epoch's work: a step, its start-up its wait
                self._open_start = t_end - start_s
                self._open_wait = start_s
                self._open_samples = -1 if samples is None else samples
            elif self.hooks is not None:  # nor in the anatomy (the fit's first is also the FLOP count's)
                self.hooks.drop_batch()
            return False  # otherwise the epoch's first batch is not a representative step
        return True

    def fetch_stopped(self, t_boundary: float) -> None:
        """The fetch raised StopIteration: the open step ends at the boundary and no step starts."""
        self.interrupt(t_boundary)
        self._epoch_first = False

    def interrupt(self, t: float, kind: str | None = None) -> None:
        """Close the open step at ``t``; charge the time until the next step to ``kind``."""
        if self.gpu is not None:
            self.gpu.interrupt()
        if self.hooks is not None:  # what runs from here to the next fetch is no step's, in the anatomy too
            self.hooks.interrupted()
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
            self._open_start += seconds  # the step starts that much later: one store less per batch
            if self.hooks is not None:
                self.hooks.exclude(seconds)

    def drop_open(self) -> bool:
        """Leave the open step out of the figures (it compiled: collect.compile_events; its FLOPs were counted:
        collect.flop_count); False if none is open."""
        dropped, self._open_start = self._open_start is not None, None
        if self.hooks is not None:
            self.hooks.drop_batch()
        return dropped

    @property
    def pause(self) -> str | None:
        """What the time since the last step is charged to ("validation", "checkpoint"), or None."""
        return self._gap_kind

    # -- results -----------------------------------------------------------------------------------------

    @property
    def steps(self) -> int:
        return self._folded.count + len(self._step_ms)

    def window_samples(self) -> tuple[array, array, array]:
        """The open window's steps so far: (step ms, wait ms, samples) each; read before :meth:`take_window`."""
        start = self._window_start
        return self._step_ms[start:], self._wait_ms[start:], self._samples[start:]

    def take_window(self) -> dict[str, float]:
        """Window metrics (means over the steps closed since the last call); resets the window."""
        start, self._window_start = self._window_start, len(self._step_ms)
        self.window_steps = 0
        figures = self._figures(start, self._window_start)
        if self._window_start > EXACT_STEPS:  # a long run: fold every closed step into the sketches
            self._folded.fold(self._step_ms, self._wait_ms, self._samples)
            self._step_ms, self._wait_ms, self._samples = array("d"), array("d"), array("q")
            self._window_start = 0
        if self.gpu is not None:
            figures.update(self.gpu.take_window())
        return figures

    def _figures(self, start: int, end: int, folded: FoldedSteps | None = None) -> dict[str, float]:
        samples = self._samples[start:end]
        steps, step_ms, wait_ms = end - start, sum(self._step_ms[start:end]), sum(self._wait_ms[start:end])
        samples_known, samples_sum = (not samples or min(samples) >= 0), sum(samples)
        if folded is not None and folded.count:
            steps, step_ms, wait_ms = (
                steps + folded.count,
                step_ms + folded.step.total,
                wait_ms + folded.wait.total,
            )
            samples_known, samples_sum = samples_known and folded.samples_known, samples_sum + folded.samples
        if steps == 0 or step_ms <= 0.0:
            return {}
        metrics = {STEP_TIME_MS: step_ms / steps, BATCHES_PER_SEC: steps / step_ms * 1e3}
        if self.measure_data_wait:
            metrics[DATA_WAIT_MS] = wait_ms / steps
            metrics[DATA_WAIT_PCT] = wait_ms / step_ms * 100.0
            metrics[COMPUTE_MS] = (step_ms - wait_ms) / steps
        if samples_known:
            metrics[SAMPLES_PER_SEC] = samples_sum / step_ms * 1e3
        return metrics

    def summary(self, train_wall_s: float = 0.0) -> TimingSummary:
        # a run past EXACT_STEPS: exact means and counts, quantiles from the sketches merged with the arrays
        folded = self._folded if self._folded.count else None
        figures = self._figures(0, len(self._step_ms), folded)
        samples = int(sum(self._samples)) + (folded.samples if folded is not None else 0)
        summary = TimingSummary(
            steps=self.steps,
            samples=samples if SAMPLES_PER_SEC in figures else 0,
            step_time_ms=self._distribution(self._step_ms, folded and folded.step),
            epoch_start_ms=Distribution.of(self._epoch_start_ms),
            epochs=self.epochs,
            validation_s=self.gap_s.get("validation", 0.0),
            checkpoint_s=self.gap_s.get("checkpoint", 0.0),
            train_wall_s=train_wall_s,
            batches_per_sec=figures.get(BATCHES_PER_SEC),
            samples_per_sec=figures.get(SAMPLES_PER_SEC),
            data_wait_pct=figures.get(DATA_WAIT_PCT),
            sketch_relative_accuracy=SKETCH_RELATIVE_ACCURACY if folded is not None else None,
        )
        steps, waits = (
            folded.spaced(self._step_ms, self._wait_ms) if folded else (self._step_ms, self._wait_ms)
        )
        if figures and self.measure_data_wait:
            summary.data_wait_ms = self._distribution(self._wait_ms, folded and folded.wait)
            compute = array("d", [s - w for s, w in zip(self._step_ms, self._wait_ms, strict=True)])
            summary.compute_ms = self._distribution(compute, folded and folded.compute)
            summary.wait_samples_ms = thinned(waits)
        summary.step_samples_ms = thinned(steps)
        return self._finish_summary(summary)

    @staticmethod
    def _distribution(values: array, folded: StepQuantiles | None) -> Distribution | None:
        return Distribution.of(values) if folded is None else folded.distribution(values)

    def _finish_summary(self, summary: TimingSummary) -> TimingSummary:
        if summary.wait_samples_ms:  # from the kept samples: bounded cost however long the run
            interval = share_interval(summary.wait_samples_ms, summary.step_samples_ms)
            if interval is not None:
                summary.data_wait_pct_low, summary.data_wait_pct_high = interval
        if self.gpu is not None:
            self.gpu.drain()  # one sync, after training
            summary.gpu_data_wait_ms = Distribution.of(self.gpu.idle_ms)
            summary.gpu_compute_ms = Distribution.of(self.gpu.step_ms)
            summary.gpu_data_wait_pct = self.gpu.run_figures().get(GPU_DATA_WAIT_PCT)
        return summary

    # -- internals ---------------------------------------------------------------------------------------

    def _close(self, t_end: float) -> None:
        step_s = t_end - self._open_start
        self._open_start = None
        if step_s > 0.0:
            wait_s = self._open_wait
            self._step_ms.append(step_s * 1e3)
            # the callback's own excluded work can make the step shorter than its fetch
            self._wait_ms.append((wait_s if wait_s < step_s else step_s) * 1e3)
            self._samples.append(self._open_samples)
            self.window_steps += 1
        elif self.hooks is not None:  # no step: nor in the anatomy
            self.hooks.drop_closed()

    def _settle_gap(self, t: float) -> None:
        if self._gap_kind is not None:
            self.gap_s[self._gap_kind] = self.gap_s.get(self._gap_kind, 0.0) + (t - self._gap_start)
            self._gap_kind = None
