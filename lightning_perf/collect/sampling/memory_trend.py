"""Memory over the training steps: process RSS and the GPU allocator, read by the utilization sampler's thread.

:class:`MemoryRecorder` keeps at most one reading per training step, each with the global step it was taken at,
and no more than ``2 * limit`` readings at any time (the oldest half is thinned evenly when full, and readings are
taken that many steps apart from then on), so a week-long run costs the same few kB as a short one.
:meth:`MemoryRecorder.series` is the ``memory`` part of the summary
(:class:`~lightning_perf.analysis.memory_series.MemorySeries`).

Which GPU figure: ``torch.cuda.memory_allocated(device)``, the bytes in live tensors of this process on the
trained device. A leak is tensors kept alive, so it shows there at once and exactly; ``memory_reserved`` (the
caching allocator's segments) climbs in 2 MiB-20 MiB stairs and can stay flat while a leak fills its cache, and
NVML's used memory counts every process on the device and the CUDA context. The trace rule reads the same
allocator figure from the profiler's memory events.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable
from typing import Any

from lightning_perf import console
from lightning_perf.analysis.memory_series import MemorySeries
from lightning_perf.analysis.numbers import BYTES_PER_GB, BYTES_PER_MB
from lightning_perf.analysis.summary import MAX_SAMPLES

log = console.logger(__name__)

MB_DECIMALS = 2  # 10 kB: far below what RSS or the allocator moves by in a step
# cgroup files with the memory limit and usage of this process's container (v2, then v1). psutil reports the
# machine's RAM only, but a container (Docker, Kubernetes, SLURM) is killed at its cgroup's limit: that is the
# capacity a growing RSS runs into.
_CGROUP_FILES = (
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
    ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
)


def cgroup_memory(files: tuple[tuple[str, str], ...] = _CGROUP_FILES) -> tuple[int, int] | None:
    """(limit, usage) in bytes of this process's memory cgroup; None without one or without a limit."""
    for limit_path, usage_path in files:
        try:
            with open(limit_path) as fh:
                limit = fh.read().strip()
            with open(usage_path) as fh:
                usage = int(fh.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit():  # v2 writes "max" when unlimited
            return int(limit), usage
    return None


def ram_capacity(psutil: Any) -> tuple[float, float]:
    """(total, available) RAM in GB for this process: the machine's, or its cgroup's when that is lower."""
    memory = psutil.virtual_memory()
    total, available = memory.total, memory.available
    cgroup = cgroup_memory()
    if cgroup is not None and cgroup[0] < total:  # v1 writes a huge number when unlimited
        total, available = cgroup[0], min(available, max(0, cgroup[0] - cgroup[1]))
    return total / BYTES_PER_GB, available / BYTES_PER_GB


class MemoryRecorder:
    """Reads memory once per new training step (at most), on the caller's thread; see the module docstring.

    Args:
        step_source: the current global step (e.g. ``lambda: trainer.global_step``).
        cuda_device: the CUDA index trained on, or None for none (no GPU series, and the summary says so).
        psutil_module: psutil, or None to import it. pid: the training process; None for this one.
        limit: readings kept in the summary at most.
    """

    def __init__(
        self,
        step_source: Callable[[], int],
        cuda_device: int | None = None,
        *,
        psutil_module: Any = None,
        pid: int | None = None,
        limit: int = MAX_SAMPLES,
    ) -> None:
        self._step_source = step_source
        self._lock = threading.Lock()
        self._limit = max(2, int(limit))
        self._stride = 1
        self._next_step: int | None = None
        self._series = MemorySeries(gpu_device=cuda_device)
        self._cuda: Any = None
        self._process: Any = None
        self._psutil = psutil_module
        try:
            if self._psutil is None:
                import psutil

                self._psutil = psutil
            self._process = self._psutil.Process(pid or os.getpid())
        except Exception as err:
            self._series.rss_unavailable_reason = f"psutil: {err}"
        if cuda_device is None:
            self._series.gpu_unavailable_reason = "no GPU in use"
        else:
            try:
                import torch

                self._cuda = torch.cuda
            except Exception as err:
                self._series.gpu_unavailable_reason = f"torch.cuda: {err}"

    def read(self) -> None:
        """One reading, when the global step moved on enough since the last one. Never raises."""
        try:
            step = int(self._step_source())
        except Exception:  # the trainer between states: try at the next wake
            return
        if self._next_step is not None and step < self._next_step:
            return
        rss = self._rss_mb()
        gpu = self._gpu_mb()
        if rss is None and gpu is None:
            return
        with self._lock:
            series = self._series
            series.steps.append(step)
            series.process_rss_mb.append(rss)
            if self._cuda is not None or series.gpu_allocated_mb:
                series.gpu_allocated_mb.append(gpu)
            self._next_step = step + self._stride
            if len(series.steps) >= 2 * self._limit:  # full: keep every other reading, read half as often
                series.steps = series.steps[::2]
                series.process_rss_mb = series.process_rss_mb[::2]
                series.gpu_allocated_mb = series.gpu_allocated_mb[::2]
                self._stride *= 2

    def _rss_mb(self) -> float | None:
        if self._process is None:
            return None
        try:
            return round(self._process.memory_info().rss / BYTES_PER_MB, MB_DECIMALS)
        except Exception as err:
            self._process = None
            self._series.rss_unavailable_reason = f"psutil during the run: {err}"
            return None

    def _gpu_mb(self) -> float | None:
        if self._cuda is None:
            return None
        try:
            return round(self._cuda.memory_allocated(self._series.gpu_device) / BYTES_PER_MB, MB_DECIMALS)
        except Exception as err:  # the GPU series ends here; the readings before stay
            self._cuda = None
            self._series.gpu_unavailable_reason = f"torch.cuda.memory_allocated during the run: {err}"
            return None

    def finish(self) -> None:
        """The capacities the memory could run into, read once at the end. Never raises."""
        series = self._series
        if self._psutil is not None:
            try:
                series.ram_total_gb, series.ram_available_gb = ram_capacity(self._psutil)
            except Exception as err:
                log.info("lightning-perf: RAM capacity not read: %s", err)
        if self._cuda is not None:
            try:
                device = series.gpu_device
                series.gpu_total_gb = self._cuda.get_device_properties(device).total_memory / BYTES_PER_GB
                # since the process started (or the user's last reset_peak_memory_stats): a training
                # process is mostly its fit, and only this counter sees the peak inside a step
                series.gpu_peak_allocated_gb = self._cuda.max_memory_allocated(device) / BYTES_PER_GB
            except Exception as err:
                series.gpu_unavailable_reason = f"torch.cuda at the end of the run: {err}"

    def series(self, interval_s: float | None = None) -> MemorySeries:
        """A copy of the readings so far, at most ``limit`` of them (evenly thinned)."""
        with self._lock:
            series = self._series
            every = max(1, -(-len(series.steps) // self._limit))  # ceil
            return dataclasses.replace(
                series,
                steps=series.steps[::every],
                process_rss_mb=series.process_rss_mb[::every],
                gpu_allocated_mb=series.gpu_allocated_mb[::every],
                interval_s=interval_s,
            )
