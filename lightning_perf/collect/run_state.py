"""PerfSession: the measuring state of one run (a ``fit``, or one ``validate``/``test``/``predict`` call).

It is the listener of the instrumented data fetcher (``fetcher.py``): on every batch boundary it ends the
previous step on the :class:`~lightning_perf.collect.steps.step_clock.StepClock` and steps the
:class:`~lightning_perf.collect.profiling.profiler_window.ProfilerWindow`; after the fetch it starts the new step with its DataLoader
wait and batch size. It holds no Lightning objects, so the callback stays a thin layer of hooks.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Mapping
from time import thread_time
from typing import TYPE_CHECKING, Any

import torch

from lightning_perf import console
from lightning_perf.analysis.compute.limit import StepFlops
from lightning_perf.analysis.summary import TraceFile
from lightning_perf.collect import compile_events
from lightning_perf.collect.cuda_events import CudaStepEvents
from lightning_perf.collect.profiling import trace_ranks as trace_policy
from lightning_perf.collect.profiling.profiler_window import ProfilerWindow
from lightning_perf.collect.sampling.machine_state import MachineWatch
from lightning_perf.collect.steps import fetch_timing
from lightning_perf.collect.steps.hook_profiler import HookProfiler
from lightning_perf.collect.steps.long_run import LongRunWatch
from lightning_perf.collect.steps.step_clock import StepClock
from lightning_perf.collect.steps.step_series import StepSeries
from lightning_perf.errors import ConfigError

if TYPE_CHECKING:
    from lightning.pytorch import Trainer

    from lightning_perf.collect.config import PerfConfig

log = console.logger(__name__)

# distinct input shapes remembered; beyond the full batch and a smaller last batch, shapes "vary"
_MAX_SHAPES = 8
_CONSTANT_SHAPES = 2
# shapes are sampled (batches 1, 9, 17, ...): varying inputs show up within a few batches, at 1/8 the cost
_SHAPE_CHECK_MASK = 7
# The fetch's CPU time (the training thread's, `time.thread_time`: 0.23 us a call here) is read around every 8th
# fetch, from the 5th batch on (the first is the epoch's start-up): a share of CPU time to wall time needs
# no more, and the reads then cost ~0.06 us a batch (benchmarks/bench_fetch_cpu.py).
_FETCH_CPU_MASK = 7
_FETCH_CPU_PHASE = 4
# The training thread's run-queue time (Linux schedstat, one pread of an open file: ~1.2 us) around the same
# fetches: whether a slow fetch was waiting for a core (a loading that computes on a busy machine) or waiting on
# storage; ~0.3 us a batch.
_RUNQUEUE_MASK = _FETCH_CPU_MASK
_SCHEDSTAT = "/proc/thread-self/schedstat"
_SEQUENCES = (list, tuple)
_TENSOR = torch.Tensor  # a module global: one lookup on the per-batch path instead of two


def _open_schedstat(owner: object) -> int:
    """This thread's schedstat, open for reads (closed with ``owner``); -1 where there is none (not Linux)."""
    try:
        fd = os.open(_SCHEDSTAT, os.O_RDONLY)
    except OSError:
        return -1
    weakref.finalize(owner, os.close, fd)
    return fd


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
        self._boundary = 0.0  # when the current batch's boundary was reached
        self.shapes: set[tuple[int, ...]] = set()
        self._largest_batch = 0  # the largest batch size found so far
        self.loader_yields_cuda: bool | None = None  # looked at on the first batch, as the loader yields it
        # (path, global step) of each saved profiler cycle, read after the last step
        self.cuda_traces: list[tuple[str, int]] = []
        self.machine = MachineWatch()  # what else the machine does while this run measures
        # set when the loop's fetcher could not be timed: the callback's batch hook drives the session
        self.hook_timing: fetch_timing.HookTiming | None = None
        self.compiles: compile_events.CompileWatch | None = None  # torch.compile's compilations (fit only)
        self.traced_ranks: list[int] = []  # the job's ranks that record traces (trace_ranks)
        self.watch: LongRunWatch | None = None  # fit only: the slowdown check and extra cycles, per window
        # fit only: every step's figures for the end-of-fit charts (output.windows.write_step_series)
        self.series = StepSeries()
        # fit only: the FLOPs of one training step (collect.flop_count), counted once; or the user's figure
        self.flops: StepFlops | None = None
        # fit only: every hook's time, for the step's anatomy (collect.steps.hook_profiler)
        self.hooks: HookProfiler | None = None
        # the sampled fetches' wall and CPU seconds (why a fetch is late when the loading runs in this thread)
        self._fetch_cpu_start = 0.0
        self.fetch_wall_s = 0.0
        self.fetch_cpu_s = 0.0
        self.fetches_sampled = 0
        # the sampled fetches' run-queue seconds and their wall seconds
        self._schedstat_fd: int | None = None  # opened by the training thread at its first sampled fetch
        self._runqueue_start = -1
        self.fetch_runqueue_s = 0.0
        self.fetch_runqueue_wall_s = 0.0
        self.fetches_runqueue_sampled = 0

    # -- fetcher listener: the hot path, once per batch (see benchmarks/README.md for its cost) ----------

    def before_fetch(self, t: float) -> bool:
        """The batch boundary at ``t``. True when it did work beyond bookkeeping (a GPU mark, profiler stepping):
        the caller then starts the step's clock after it."""
        self._boundary = t
        hooks = self.hooks
        if hooks is not None:
            hooks.next_batch()
        marked = self.clock.gpu is not None
        if marked:
            self.clock.gpu_boundary()
        step = self.batches
        self.batches = step + 1
        if self.window is not None and self.window.boundary(step):
            marked = True
        if step & _FETCH_CPU_MASK == _FETCH_CPU_PHASE:
            self._fetch_cpu_start = thread_time()
            if step & _RUNQUEUE_MASK == _FETCH_CPU_PHASE:
                self._runqueue_start = self._runqueue_ns()
        return marked

    def after_fetch(self, t_start: float, t_end: float, fetched: Any) -> None:
        # Lightning's fetchers return (batch, batch_idx, dataloader_idx)
        batch = fetched[0] if type(fetched) is tuple and len(fetched) == 3 else fetched
        # the usual (inputs, targets) batch is looked at without a call; anything else is searched
        tensor = batch[0] if type(batch) in _SEQUENCES and batch else batch
        if type(tensor) is not _TENSOR:
            tensor = first_tensor(batch)
        samples = self.batch_size_override
        if tensor is not None:
            shape = tensor.shape  # ~0.1 us, the costliest call here: made once
            if self.batches & _SHAPE_CHECK_MASK == 1:  # input shapes are looked at on every 8th batch only
                self._note_input(tensor, shape)
            if samples is None and shape:
                samples = shape[0]
                if samples > self._largest_batch:
                    self._largest_batch = samples
        self.clock.batch(self._boundary, t_start, t_end, samples)
        if self.batches & _FETCH_CPU_MASK == _FETCH_CPU_PHASE + 1:
            self.fetch_cpu_s += thread_time() - self._fetch_cpu_start
            self.fetch_wall_s += t_end - t_start
            self.fetches_sampled += 1
            if self.batches & _RUNQUEUE_MASK == _FETCH_CPU_PHASE + 1 and self._runqueue_start >= 0:
                end = self._runqueue_ns()
                if end >= self._runqueue_start:
                    self.fetch_runqueue_s += (end - self._runqueue_start) / 1e9
                    self.fetch_runqueue_wall_s += t_end - t_start
                    self.fetches_runqueue_sampled += 1

    def _runqueue_ns(self) -> int:
        """The training thread's run-queue nanoseconds so far; -1 where schedstat cannot be read."""
        fd = self._schedstat_fd
        if fd is None:
            fd = self._schedstat_fd = _open_schedstat(self)
        if fd < 0:
            return -1
        try:
            return int(os.pread(fd, 64, 0).split()[1])
        except (OSError, ValueError, IndexError):
            return -1

    def fetch_stopped(self) -> None:
        self.clock.fetch_stopped(self._boundary)

    def iterator_created(self, seconds: float) -> None:
        self.clock.iterator_created(seconds)

    # -- batch inspection --------------------------------------------------------------------------------

    @property
    def batch_size_seen(self) -> int | None:
        """The largest batch size found in the batches (None with ``batch_size`` given, or none found)."""
        return self._largest_batch or None

    @property
    def input_shapes_vary(self) -> bool | None:
        if not self.shapes:
            return None
        return len(self.shapes) > _CONSTANT_SHAPES

    def _note_input(self, tensor: torch.Tensor, shape: torch.Size) -> None:
        if len(self.shapes) < _MAX_SHAPES:
            self.shapes.add(tuple(shape))
        if self.loader_yields_cuda is None:
            self.loader_yields_cuda = tensor.is_cuda


def open_session(
    trainer: Trainer,
    stage: str,
    fetcher: Any,
    config: PerfConfig,
    trace_dir: str | None,
    on_trace: Callable[[PerfSession, TraceFile], None],
) -> PerfSession:
    """A new measuring session for ``stage``, attached to the loop's data fetcher.

    ``on_trace`` is called for every saved cycle (read after the last step: figures, top operators).
    """
    measure_wait = fetcher is not None and not fetch_timing.fetches_inside_step(fetcher)
    if fetcher is not None and not measure_wait:
        log.info(
            "lightning-perf: training_step fetches its own batches (dataloader_iter); DataLoader wait "
            "cannot be measured at the fetch and is not reported."
        )
    gpu = CudaStepEvents.for_device(trainer.strategy.root_device) if stage == "fit" else None
    session = PerfSession(stage, StepClock(measure_wait, gpu), None, config.batch_size)
    if (
        stage == "fit"
    ):  # a fit resumed from a checkpoint goes on counting: ProfilerStep#N stays global batch N
        session.batches = batches_done(trainer)
        session.compiles = compile_events.watch(session)
    traced = traced_ranks(trainer, config)
    session.traced_ranks = sorted(traced)
    if stage == "fit" and traced and trainer.world_size > 1 and trainer.is_global_zero:
        log.info(
            f"lightning-perf: {trace_policy.describe(traced, trainer.world_size)} record traces "
            f"(trace_ranks={config.trace_ranks!r}), up to {config.max_trace_mb:g} MB each "
            f"({config.max_trace_mb * len(traced):g} MB in all); every rank times its steps and samples"
        )
    if trainer.global_rank in traced:  # the other ranks create no torch profiler at all
        activities = config.activities or _default_activities(trainer)
        session.window = ProfilerWindow(
            config,
            activities,
            trace_dir or trainer.default_root_dir,
            global_rank=trainer.global_rank,
            world_size=trainer.world_size,
            backend=_backend(),
            # every saved cycle, CPU-only ones too: the end of fit names its top operators from it
            on_trace=lambda trace, prof: on_trace(session, trace),
            device=str(trainer.strategy.root_device),
            recording=trace_policy.describe(traced, trainer.world_size),
        )
    if stage == "fit":
        session.watch = LongRunWatch(config, trace_dir or trainer.default_root_dir, trainer.global_rank)
    if not fetch_timing.instrument(fetcher, session):
        # no fetcher to time: boundaries come from the batch hooks, where the DataLoader wait is not visible
        session.clock = StepClock(measure_data_wait=False)
        session.hook_timing = fetch_timing.HookTiming(session)
    return session


def traced_ranks(trainer: Trainer, config: PerfConfig) -> set[int]:
    """The global ranks of this job that record traces (``trace_ranks``; none without the profiler). A
    :class:`ConfigError` when ``trace_ranks`` lists a rank the job does not have."""
    if not config.enable_profiler:
        return set()
    world_size = max(1, int(trainer.world_size))
    # Lightning numbers ranks node by node: global rank = node_rank * devices + local_rank
    return trace_policy.ranks_to_trace(world_size, max(1, int(trainer.num_devices)), config.trace_ranks)


def batches_done(trainer: Trainer) -> int:
    """Training batches run before this fit started: 0, or where a checkpoint's fit left off."""
    progress = getattr(getattr(trainer.fit_loop, "epoch_loop", None), "batch_progress", None)
    done = getattr(getattr(progress, "total", None), "ready", 0)
    return done if isinstance(done, int) and done > 0 else 0


def one_per_trainer(callbacks: list[Any], callback: Any, kind: type) -> None:
    """Allow one ``kind`` instance per Trainer: another one is an error (both would drive the one profiler,
    fetcher and summary file); the same one listed twice is listed once (its hooks would run twice)."""
    others = [other for other in callbacks if isinstance(other, kind) and other is not callback]
    if others:
        raise ConfigError(
            f"`Trainer(callbacks=...)` holds {len(others) + 1} {kind.__name__}s; one measures a run, two would "
            "take over each other's profiler, data fetcher and perf_summary.json. Keep one."
        )
    while callbacks.count(callback) > 1:  # in place: Lightning is iterating this list to call setup
        del callbacks[len(callbacks) - 1 - callbacks[::-1].index(callback)]


def run_status(exception: BaseException) -> str:
    """``interrupted`` for Ctrl-C and SIGTERM (Lightning raises SIGTERMException), ``failed`` otherwise."""
    from lightning.pytorch.utilities import exceptions

    stops = (KeyboardInterrupt, getattr(exceptions, "SIGTERMException", KeyboardInterrupt))
    return "interrupted" if isinstance(exception, stops) else "failed"


def _default_activities(trainer: Trainer) -> tuple[str, ...]:
    return ("cpu", "cuda") if trainer.strategy.root_device.type == "cuda" else ("cpu",)


def _backend() -> str | None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return str(torch.distributed.get_backend())
    return None
