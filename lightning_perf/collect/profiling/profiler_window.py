"""ProfilerWindow: the lifecycle of ``torch.profiler`` over a schedule, and where its traces go.

A profiler exists only around a cycle: it is created on the cycle's first warm-up (or recorded) batch and
closed after its last recorded batch, because ``profile.step()`` does work on every call even when idle.
Between cycles the per-batch cost is one integer comparison. Traces are written as
``<host>_rank<global_rank>.<ns>.pt.trace.json.gz`` in the run's log dir, the layout torch-tb-profiler reads,
rewritten so that every trace tool attributes DataLoader time and ranks correctly (``traces.rewrite_trace``).
Nothing here may break training: I/O and export errors become one warning each and training goes on.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import os
import re
import shutil
import socket
import time
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch.profiler import ProfilerAction, ProfilerActivity

from lightning_perf import console
from lightning_perf.analysis.numbers import BYTES_PER_MB, size_text
from lightning_perf.analysis.summary import TraceFile
from lightning_perf.atomic_file import (
    atomic_path,
    describe_os_error,
    is_persistent,
    remove_quietly,
    why_unwritable,
)
from lightning_perf.collect.profiling.schedule import ProfileSchedule

if TYPE_CHECKING:
    from lightning_perf.collect.config import PerfConfig

log = console.logger(__name__)

_ACTIVITIES = {"cpu": ProfilerActivity.CPU, "cuda": ProfilerActivity.CUDA}
_RECORDING = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
TRACE_SUFFIX = ".pt.trace.json.gz"


def worker_name(global_rank: int, host: str | None = None) -> str:
    """``<host>_rank<global_rank>``: unique across nodes, unlike Lightning's local-rank file names."""
    host = host or socket.gethostname()
    # torch-tb-profiler splits file names on '.', so keep the host name to a safe alphabet
    safe_host = re.sub(r"[^A-Za-z0-9_-]", "-", host) or "host"
    return f"{safe_host}_rank{global_rank}"


class ProfilerWindow:
    """Drives one ``torch.profiler.profile`` per schedule cycle from batch boundaries.

    Call :meth:`boundary` once at the start of every batch (before its fetch, so each ``ProfilerStep#N``
    span covers the whole batch), :meth:`end_step_span` when a batch's own work has ended early
    (validation or the epoch end follow), and :meth:`close` when the run ends, however it ends.
    """

    def __init__(
        self,
        config: PerfConfig,
        activities: Sequence[str],
        trace_dir: str,
        *,
        global_rank: int = 0,
        world_size: int = 1,
        backend: str | None = None,
        on_trace: Callable[[TraceFile, object], None] | None = None,
        device: str | None = None,
        recording: str | None = None,
    ) -> None:
        schedule = config.schedule
        self.config = config
        self.schedule = schedule
        self.activities = tuple(activities)
        self.trace_dir = trace_dir
        self.global_rank = global_rank
        self.world_size = world_size
        self.backend = backend
        self.max_trace_bytes = config.max_trace_bytes
        self.on_trace = on_trace
        # the rank's own device ("cuda:3" on local rank 3), for the memory timeline; None: the current one
        self.device = device
        self.worker = worker_name(global_rank)
        # the job's ranks that record traces, for the budget warnings: the cap is per rank, the disk is shared
        distributed = recording is not None and world_size > 1
        self._where = f" on rank {global_rank} (traces are recorded by {recording})" if distributed else ""
        self.traces: list[TraceFile] = []
        self.bytes_written = 0
        self.recorded_steps = 0
        self._largest_trace = 0
        self._prof: torch.profiler.profile | None = None
        self._cycle_steps: list[int] = []
        self._next_start: int | None = schedule.next_cycle_start(0)
        self._cap_warned = False
        self._foreign_warned = False
        self._no_more_cycles = False
        self._base_schedule: ProfileSchedule | None = None  # the user's, while an extra cycle runs
        self.label = ""  # "slowdown", "capture": the extra cycle's trace is named <worker>_<label>.<ns>
        # True when a profiler starts, False when it stops (module_spans.recording_switch, which never raises)
        self.on_recording: Callable[[bool], None] = lambda on: None

    @property
    def active(self) -> bool:
        """True while a profiler exists (warm-up or recording)."""
        return self._prof is not None

    @property
    def finished(self) -> bool:
        """True when no cycle is open and none is left."""
        return self._prof is None and self._next_start is None

    def boundary(self, step: int) -> bool:
        """Batch ``step`` is about to be fetched. True when this did more than look (its time is not the step's)."""
        prof = self._prof
        if prof is None:
            if self._next_start is None or step < self._next_start:
                return False  # the hot path between cycles: one comparison
            if self.schedule.action(step) is ProfilerAction.NONE:
                self._next_start = self._next_cycle(step)
                return True
            self._open(step)
            return True
        try:
            prof.step()  # saves the trace (on_trace_ready) when the previous batch ended a cycle
        except Exception as err:  # a profiler failure must not stop training
            self._abandon(f"torch profiler failed at batch {step}: {err}")
            return True
        action = self.schedule.action(step)
        if action is ProfilerAction.NONE or self._no_more_cycles:  # cycles end early: cap, full disk
            self._stop_profiler()
            self._next_start = self._next_cycle(step)
        elif action in _RECORDING:
            self._cycle_steps.append(step)
        return True

    def end_step_span(self) -> None:
        """End the open ``ProfilerStep#N`` span now: what follows (validation, epoch end) is not that batch."""
        prof = self._prof
        span = getattr(prof, "step_rec_fn", None) if prof is not None else None
        if span is not None:
            span.__exit__(None, None, None)
            prof.step_rec_fn = None  # so profile.step() does not close it a second time

    def request_cycle(self, step: int, label: str) -> bool:
        """Record one extra cycle (warm-up + active batches) from batch ``step`` on, its trace named
        ``<worker>_<label>``. False when a cycle is open or profiling has stopped for this run (cap, disk)."""
        if self._prof is not None or self._no_more_cycles or self._base_schedule is not None:
            return False
        with warnings.catch_warnings():  # warmup=0 was warned about once, with the user's schedule
            warnings.simplefilter("ignore")
            extra = ProfileSchedule(step, 0, self.schedule.warmup, self.schedule.active, 1)
        self._base_schedule, self.schedule, self.label = self.schedule, extra, label
        self._next_start = step
        return True

    def close(self) -> None:
        """Stop any running profiler, saving the batches already recorded in the open cycle."""
        self._stop_cycles()
        if self._prof is not None:
            self._stop_profiler()

    # -- internals ---------------------------------------------------------------------------------------

    def _stop_cycles(self) -> None:
        """No cycle starts any more (closed, over the cap, disk full, profiler broken)."""
        self._no_more_cycles = True
        self._next_start = None

    def _next_cycle(self, step: int) -> int | None:
        if self._base_schedule is not None:  # an extra cycle ended: back to the user's schedule
            self.schedule, self._base_schedule, self.label = self._base_schedule, None, ""
        return None if self._no_more_cycles else self.schedule.next_cycle_start(step)

    def _open(self, step: int) -> None:
        if self._over_budget():
            self._stop_cycles()
            return
        if profiler_enabled():  # the user's, Lightning's or another tool's: stopping ours would end theirs
            self._skip_cycle(step)
            return
        try:
            prof = torch.profiler.profile(
                activities=[_ACTIVITIES[name] for name in self.activities],
                schedule=self.schedule.action,
                on_trace_ready=self._on_trace_ready,
                record_shapes=self.config.record_shapes,
                profile_memory=self.config.profile_memory,
                with_stack=self.config.with_stack,
                with_flops=self.config.with_flops,
                experimental_config=self._experimental_config(),
            )
            _align_step(prof, step, self.schedule.action(step))
            prof.start()
        except Exception as err:
            self._abandon(f"could not start the torch profiler at batch {step}: {err}")
            return
        self._prof = prof
        self._cycle_steps = [step] if self.schedule.action(step) in _RECORDING else []
        self.on_recording(True)

    def _skip_cycle(self, step: int) -> None:
        if not self._foreign_warned:
            self._foreign_warned = True
            warnings.warn(
                "lightning-perf: another torch profiler is already recording (the user's "
                "torch.profiler.profile(), Lightning's profiler or another PerfCallback); profiling cycles "
                "are skipped while it runs so that its trace stays whole. Timing, utilization and the "
                "diagnosis go on.",
                stacklevel=4,
            )
        cycle = self.schedule.cycle_length
        cycle_end = self.schedule.skip_first + ((step - self.schedule.skip_first) // cycle + 1) * cycle
        self._next_start = self._next_cycle(cycle_end)

    def _experimental_config(self) -> object | None:
        if not (self.config.with_stack and self.config.export_stacks):
            return None
        # export_stacks writes empty files without the verbose config (PyTorch issue 100253)
        from lightning_perf.traces.exports import stacks_experimental_config

        return stacks_experimental_config()

    def _over_budget(self) -> bool:
        if self.max_trace_bytes is None:
            return False
        # skip a cycle that would pass the cap, judging its size by the largest trace so far
        if self.bytes_written + self._largest_trace <= self.max_trace_bytes and (
            self.bytes_written < self.max_trace_bytes
        ):
            return False
        if not self._cap_warned:
            self._cap_warned = True
            log.warning(
                f"lightning-perf: {size_text(self.bytes_written / BYTES_PER_MB)} of traces written{self._where}; "
                f"the next cycle would pass `max_trace_mb` ({size_text(self.max_trace_bytes / BYTES_PER_MB)}), so "
                "later profiling cycles are skipped. Raise `max_trace_mb` to profile more."
            )
        return True

    def _stop_profiler(self) -> None:
        prof, self._prof = self._prof, None
        self.on_recording(False)
        try:
            prof.stop()  # saves the open cycle when it recorded anything (torch calls on_trace_ready)
        except Exception as err:
            log.warning(f"lightning-perf: stopping the torch profiler failed: {err}")
        finally:
            _ensure_profiler_disabled()
            self._cycle_steps = []

    def _abandon(self, message: str) -> None:
        log.warning(f"lightning-perf: {message}; profiling is off for the rest of this run")
        prof, self._prof = self._prof, None
        self.on_recording(False)
        self._stop_cycles()
        if prof is not None:
            with contextlib.suppress(Exception):  # already reported; the profiler is dropped either way
                prof.stop()
        _ensure_profiler_disabled()

    def _on_trace_ready(self, prof: torch.profiler.profile) -> None:
        steps = list(self._cycle_steps)
        self._cycle_steps = []
        if not steps:
            return  # a cycle stopped during warm-up recorded nothing: an empty trace is noise
        try:
            trace = self._write_trace(prof, steps)
        except _OverCap as over:
            self._stop_cycles()
            log.warning(
                f"lightning-perf: the trace of batches {steps[0]}-{steps[-1]} ({size_text(over.size / BYTES_PER_MB)})"
                f"{self._where} would pass `max_trace_mb` ({size_text(self.max_trace_bytes / BYTES_PER_MB)}) and "
                "was not kept; later profiling cycles are skipped. Raise `max_trace_mb` to profile more."
            )
            return
        except Exception as err:  # disk full, unwritable dir, a corrupt export, ...
            self._write_failed(steps, err)
            return
        self.traces.append(trace)
        self.recorded_steps += len(steps)
        self.bytes_written += trace.bytes
        self._largest_trace = max(self._largest_trace, trace.bytes)
        if self.on_trace is not None:
            self.on_trace(trace, prof)

    def _write_failed(self, steps: list[int], err: Exception) -> None:
        later = ""
        if is_persistent(err):  # the next cycle would meet the same full disk or read-only dir
            self._stop_cycles()
            later = " Later profiling cycles are skipped."
        reason = describe_os_error(err) if isinstance(err, OSError) else str(err)
        where = getattr(err, "filename", None) or self.trace_dir
        log.warning(
            f"lightning-perf: could not write the trace of batches {steps[0]}-{steps[-1]} to {where}: "
            f"{reason}. Training continues.{later}"
        )

    def _write_trace(self, prof: torch.profiler.profile, steps: list[int]) -> TraceFile:
        os.makedirs(self.trace_dir, exist_ok=True)
        label = f"_{self.label}" if self.label else ""
        base = os.path.join(self.trace_dir, f"{self.worker}{label}.{time.time_ns()}")
        final_path = base + TRACE_SUFFIX
        raw_path = os.path.join(self.trace_dir, f".{os.path.basename(base)}.raw.json")
        try:
            prof.export_chrome_trace(raw_path)
            if hasattr(prof, "wait_for_exports"):
                prof.wait_for_exports()
            if not os.path.exists(raw_path):  # Kineto logs "Failed to write" and returns: find out why
                raise why_unwritable(self.trace_dir) or OSError(
                    errno.EIO, "the torch profiler wrote no trace file", raw_path
                )
            # under its final name only when complete and kept; ".gz" at the end tells the rewrite to compress
            with atomic_path(final_path, ending=".gz") as staged:
                size = self._finalize(raw_path, staged)
                if self.max_trace_bytes is not None and self.bytes_written + size > self.max_trace_bytes:
                    raise _OverCap(size)
        finally:
            remove_quietly(raw_path, raw_path + ".tmp")  # Kineto's own temporary, left on a failed write
        self._write_exports(prof, base, final_path)
        return TraceFile(path=os.path.basename(final_path), steps=steps, bytes=size)

    def _finalize(self, raw_path: str, final_path: str) -> int:
        from lightning_perf.traces.read.reader import rewrite_trace

        try:
            return rewrite_trace(
                raw_path,
                final_path,
                global_rank=self.global_rank,
                world_size=self.world_size,
                backend=self.backend,
            )
        except OSError:
            raise  # the disk, not the trace: a copy would fail the same way
        except Exception as err:
            # keep the trace as torch wrote it rather than lose it
            log.warning("lightning-perf: trace rewrite failed (%s); keeping the trace unmodified", err)
            with open(raw_path, "rb") as src, gzip.open(final_path, "wb") as dst:
                shutil.copyfileobj(src, dst)
            return os.path.getsize(final_path)

    def _write_exports(self, prof: torch.profiler.profile, base: str, trace_path: str) -> None:
        from lightning_perf.traces import exports

        jobs: list[tuple[str, Callable[[], object]]] = []
        if self.config.with_stack and self.config.export_stacks:
            jobs.append(("collapsed stacks", lambda: exports.export_collapsed_stacks(prof, base)))
        if self.config.export_speedscope:
            jobs.append(
                ("speedscope", lambda: exports.trace_to_speedscope(trace_path, base + ".speedscope.json"))
            )
        if (
            self.config.export_memory_timeline
            and self.config.profile_memory
            and self.config.record_shapes
            and self.config.with_stack
        ):
            device = (
                (self.device or f"cuda:{torch.cuda.current_device()}") if "cuda" in self.activities else "cpu"
            )
            jobs.append(
                (
                    "memory timeline",
                    lambda: exports.export_memory_timeline(prof, base + ".memory.html", device),
                )
            )
        for label, job in jobs:
            try:
                job()
            except Exception as err:
                persistent = is_persistent(
                    err
                )  # a full or read-only disk: later writes would only fail again
                reason = describe_os_error(err) if isinstance(err, OSError) else err
                later = " Later profiling cycles are skipped." if persistent else ""
                log.warning(f"lightning-perf: {label} export failed: {reason}.{later}")
                if persistent:
                    self._stop_cycles()
                    return


def _align_step(prof: torch.profiler.profile, step: int, action: ProfilerAction) -> None:
    """Start the new profiler at batch ``step`` so its ``ProfilerStep#N`` names match the batch index."""
    prof.step_num = step
    prof.current_action = action
    if hasattr(prof, "_prev_schedule_action"):  # torch >= 2.10 keeps the last schedule answer too
        prof._prev_schedule_action = action


class _OverCap(Exception):
    """A finished trace that would pass ``max_trace_mb``; it is dropped before it gets its final name."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


def profiler_enabled() -> bool:
    """Whether any autograd/kineto profiler is currently recording in this process."""
    return bool(torch._C._autograd._profiler_enabled())


def _ensure_profiler_disabled() -> None:
    # A profiler that failed half-way can stay enabled and tax every later op; never leave one behind.
    if torch._C._autograd._profiler_enabled():
        try:
            torch._C._autograd._disable_profiler()
        except Exception as err:
            log.warning("lightning-perf: could not disable a leftover torch profiler: %s", err)
        torch.autograd.profiler._is_profiler_enabled = False
