"""Device utilization: GPU through NVML (nvidia-ml-py), CPU through psutil, sampled on a background thread.

:class:`UtilSampler` reads every ``interval_s`` (default 0.1 s) and keeps averages per window
(:meth:`UtilSampler.take_window`, since the previous call) and per run (:meth:`UtilSampler.summary`) of the
``perf_gpu/*`` and ``perf_cpu/*`` metrics (:mod:`lightning_perf.analysis.metrics` has their units and
meanings). The DataLoader workers are the live descendant processes of the training process.

Several GPUs in one process are averaged (peak memory is the largest on any one of them);
:meth:`UtilSampler.device_summaries` keeps per-GPU run figures. A metric that was not measured is absent,
never zero: with no GPU in use, no NVML, or an NVML error the GPU keys are left out, one log line says why,
``gpu_unavailable_reason`` keeps the reason and the CPU is still sampled. After an NVML error mid-run the
summary keeps the GPU figures measured until then, beside the reason. The sampler shares the GIL with
training, so a sample does little Python work: NVML handles are resolved once at ``start()``, and the scan
for new workers (which reads every process in /proc) runs at most every :data:`CHILD_RESCAN_S`.

This module holds the sampler and its statistics; the CPU side (:class:`PsutilBackend`) is in
:mod:`lightning_perf.collect.sampling.cpu_sampler`, the NVML side (the rank's own device found by UUID,
:class:`~lightning_perf.collect.sampling.nvml.NvmlBackend`) in :mod:`lightning_perf.collect.sampling.nvml`.

Example::

    sampler = UtilSampler(cuda_devices=[0])
    sampler.start()
    ...                          # train; every N steps: logger.log_metrics(sampler.take_window(), step)
    sampler.stop()
    summary = sampler.summary()  # lightning_perf.analysis.summary.UtilizationSummary
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from lightning_perf import console
from lightning_perf.analysis.numbers import finite, whole
from lightning_perf.analysis.summary import CpuUtilization, GpuUtilization, UtilizationSummary
from lightning_perf.collect.sampling.cpu_sampler import (
    CPU_UTIL,
    PROCESS_RSS,
    SYSTEM_CPU,
    WORKERS_CPU,
    WORKERS_RSS,
    PsutilBackend,
    usable_cpu_count,
)
from lightning_perf.collect.sampling.memory_trend import MemoryRecorder
from lightning_perf.collect.sampling.nvml import (
    GPU_KEYS,
    GPU_MEM_USED,
    GpuUnavailable,
    NvmlBackend,
    PciLookup,
    UuidLookup,
    torch_cuda_pci,
    torch_cuda_uuid,
)
from lightning_perf.collect.sampling.sampler_stats import Stats, clock_figures, gpu_figures
from lightning_perf.errors import ConfigError

__all__ = [
    "CPU_UTIL",
    "PROCESS_RSS",
    "SYSTEM_CPU",
    "WORKERS_CPU",
    "WORKERS_RSS",
    "PsutilBackend",
    "UtilSampler",
    "usable_cpu_count",
]

log = console.logger(__name__)

DEFAULT_INTERVAL_S = 0.1
# CPU figures come from cumulative counters (CPU seconds), so reading them once a second loses nothing of their
# averages, while each read costs the training thread: /proc reads hand the GIL back and forth (measured here:
# ~1% of a sub-millisecond-step run at 10 reads/s, ~0.1% at 1/s). GPU utilization is a sampled value and is
# read every interval_s.
CPU_INTERVAL_S = 1.0
# stop() waits this long for the thread: one NVML call on a GPU in a bad state can block for seconds
STOP_JOIN_TIMEOUT_S = 10.0


class UtilSampler:
    """Samples GPU (NVML) and CPU (psutil) utilization on a daemon thread; see the module docstring.

    Args:
        interval_s: seconds between GPU samples (> 0).
        cpu_interval_s: seconds between CPU reads; None: the larger of ``interval_s`` and
            :data:`CPU_INTERVAL_S`; 0 reads the CPU on every sample.
        cuda_devices: CUDA indices (as torch numbers them) this process trains on; None or [] for none.
        nvml: the NVML module; None imports ``pynvml`` (nvidia-ml-py). Tests pass a fake.
        cuda_uuid_lookup: CUDA index -> UUID string; None asks torch. Tests pass a fake.
        cuda_pci_lookup: CUDA index -> (domain, bus, device), tried when the UUID does not match; None asks
            torch, unless cuda_uuid_lookup is given (then only UUIDs are matched).
        psutil_module: the psutil module; None imports it. Tests may pass a fake.
        pid: the training process; None for this process.
        exclude_pids: child processes that are no DataLoader workers, left out of the worker figures with
            their descendants: e.g. the other local ranks Lightning's DDP launcher starts from rank 0.
        memory: reads process RSS and GPU memory at each sample of a training step (at most one per step),
            for the memory series of the summary; None for none.
    """

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        cuda_devices: list[int] | None = None,
        *,
        nvml: Any = None,
        cuda_uuid_lookup: UuidLookup | None = None,
        cuda_pci_lookup: PciLookup | None = None,
        psutil_module: Any = None,
        pid: int | None = None,
        exclude_pids: list[int] | None = None,
        cpu_interval_s: float | None = None,
        memory: MemoryRecorder | None = None,
    ) -> None:
        if not (finite(interval_s) is not None and interval_s > 0):
            raise ConfigError(f"interval_s must be a finite number of seconds > 0, got {interval_s!r}")
        if cuda_devices is not None and not all(whole(i) is not None and i >= 0 for i in cuda_devices):
            raise ConfigError(
                f"cuda_devices must be a list of CUDA indices >= 0 or None, got {cuda_devices!r}"
            )
        if pid is not None and not (whole(pid) is not None and pid > 0):
            raise ConfigError(f"pid must be a process id > 0 or None (this process), got {pid!r}")
        if cpu_interval_s is not None and not (finite(cpu_interval_s) is not None and cpu_interval_s >= 0):
            raise ConfigError(
                f"cpu_interval_s must be a number of seconds >= 0 or None, got {cpu_interval_s!r}"
            )
        self.interval_s = float(interval_s)
        self.cpu_interval_s = (
            max(self.interval_s, CPU_INTERVAL_S) if cpu_interval_s is None else cpu_interval_s
        )
        self._next_cpu_read = 0.0
        self.cuda_devices = list(cuda_devices or [])
        self._nvml = nvml
        self._uuid_lookup = cuda_uuid_lookup or torch_cuda_uuid
        self._pci_lookup = cuda_pci_lookup or (torch_cuda_pci if cuda_uuid_lookup is None else None)
        self._psutil = psutil_module
        self._pid = pid
        self._exclude_pids = list(exclude_pids or [])
        self.memory = memory
        self.gpu_unavailable_reason: str | None = None
        self.nvml_uuids: list[
            str
        ] = []  # the NVML UUID of each CUDA device in use ("GPU-"/"MIG-"), once started
        # paused between training steps (validation, checkpoints, epoch starts): samples then are not kept,
        # so utilization covers the same intervals as the step timing it is compared with
        self.paused = False
        #: readings NVML cannot give for a device in use (NOT_SUPPORTED / NO_PERMISSION), with its answer
        self.gpu_metrics_unavailable: dict[str, str] = {}
        self._lock = threading.Lock()  # guards the statistics below; held only to add or swap them
        self._cpu_lock = threading.Lock()
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._gpu: NvmlBackend | None = None
        self._cpu: PsutilBackend | None = None
        self._opened = False
        self._reset()

    def _reset(self) -> None:
        self._window = Stats()
        self._run = Stats()
        self._device_stats: list[Stats] = []  # one per GPU in use, in cuda_devices order
        self._gpu_names: list[str] = []
        self._compute_capability: list[int] | None = None
        self._max_sm_clock: list[float | None] = []
        self._workers_seen = 0
        # the workers' (wall, CPU, run-queue) seconds summed over the kept reads; run queue None: unreadable
        self._workers_time: list[Any] = [0.0, 0.0, 0.0]
        self._next_cpu_read = 0.0
        self.gpu_metrics_unavailable = {}

    def start(self) -> None:
        """Open NVML and psutil (once, here) and start the thread. A start() after stop() starts a new run."""
        if self.is_running():
            raise RuntimeError("UtilSampler.start(): already running; call stop() first")
        self._close()
        self._reset()
        self._open()
        self._stop_event = threading.Event()
        thread = threading.Thread(
            target=self._loop, args=(self._stop_event,), name="lightning_perf-util-sampler", daemon=True
        )
        try:
            thread.start()
        except RuntimeError as err:  # out of threads: go without figures rather than fail the training
            log.warning("lightning-perf: utilization sampler not started: %s", err)
            self._close()
            return
        self._thread = thread

    def stop(self) -> None:
        """Stop sampling, join the thread and release NVML; idempotent. The figures stay readable."""
        thread, self._thread = self._thread, None
        self._stop_event.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(STOP_JOIN_TIMEOUT_S)
            if thread.is_alive():  # stuck in an NVML call: leave NVML to it (a daemon thread ends with us)
                log.warning(
                    "lightning-perf: utilization sampler still busy after %.0f s", STOP_JOIN_TIMEOUT_S
                )
                return
        if thread is not None and self._opened:  # a last CPU read: the run's averages cover its very end
            self._sample_cpu(force=True)
        if self.memory is not None:
            self.memory.finish()
        self._close()

    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self, stop_event: threading.Event) -> None:
        # without a GPU or memory series to sample, the thread only wakes for the (rarer) CPU reads
        every_sample = self._gpu is not None or self.memory is not None
        wait_s = self.interval_s if every_sample else max(self.interval_s, self.cpu_interval_s)
        while not stop_event.wait(wait_s):
            try:
                self.sample_once()
            except Exception:  # a bug here must not reach training: stop sampling, say so once
                log.warning("lightning-perf: utilization sampler stopped by an error", exc_info=True)
                return

    def _open(self) -> None:
        self._opened = True
        self.gpu_unavailable_reason = "no GPU in use" if not self.cuda_devices else None
        if self.cuda_devices:
            try:
                nvml = self._nvml
                if nvml is None:
                    try:
                        import pynvml
                    except ImportError as err:
                        raise GpuUnavailable("nvidia-ml-py (pynvml) not installed") from err
                    nvml = pynvml
                self._gpu = NvmlBackend.open(nvml, self.cuda_devices, self._uuid_lookup, self._pci_lookup)
                self.nvml_uuids, self._gpu_names = self._gpu.uuids, self._gpu.names
                self._compute_capability = self._gpu.compute_capability
                self._max_sm_clock = self._gpu.max_sm_clock_mhz
                self._device_stats = [Stats() for _ in self.cuda_devices]
            except Exception as err:  # GpuUnavailable, or anything unexpected from the NVML module
                self.gpu_unavailable_reason = (
                    str(err) if isinstance(err, GpuUnavailable) else f"NVML error: {err}"
                )
        if self.gpu_unavailable_reason is not None:
            log.info("lightning-perf: GPU utilization not measured: %s", self.gpu_unavailable_reason)
        try:
            psutil = self._psutil
            if psutil is None:
                import psutil
            self._cpu = PsutilBackend(psutil, self._pid or os.getpid(), self._exclude_pids)
        except Exception as err:
            log.info("lightning-perf: CPU utilization not measured: %s", err)

    def _close(self) -> None:
        if self._gpu is not None:
            self._gpu.close()
        self._gpu = self._cpu = None
        self._opened = False

    def sample_once(self) -> None:
        """Take one sample now. The thread calls this every ``interval_s``; tests may call it directly,
        without start() (stop() then releases NVML)."""
        if not self._opened:
            self._open()
        if self.paused:  # between steps: nothing to compare these readings with
            return
        rows: list[dict[str, float]] = []
        if self._gpu is not None:
            try:
                rows = self._gpu.read()
                self.gpu_metrics_unavailable = self._gpu.unavailable
            except Exception as err:
                unavailable = isinstance(err, GpuUnavailable)
                self.gpu_unavailable_reason = str(err) if unavailable else f"NVML error during the run: {err}"
                log.warning("lightning-perf: GPU sampling stopped (%s); GPU figures end here", err)
                self._gpu.close()
                self._gpu = None
        sample: dict[str, float] = {}
        for key in GPU_KEYS:  # several GPUs: the mean of those that report the metric
            values = [row[key] for row in rows if key in row]
            if values:
                sample[key] = sum(values) / len(values)
        self._add(sample, rows)
        self._sample_cpu(force=False)
        if self.memory is not None:
            self.memory.read()

    def _sample_cpu(self, force: bool) -> None:
        """Read the CPU figures when due (or ``force``) and keep them, weighted by the seconds they cover."""
        with self._cpu_lock:  # the sampler thread and take_window/stop on the training thread both read
            if self._cpu is None or not (force or time.monotonic() >= self._next_cpu_read):
                return
            self._next_cpu_read = time.monotonic() + self.cpu_interval_s
            try:
                cpu, workers = self._cpu.read()
            except Exception as err:
                log.warning("lightning-perf: CPU sampling stopped: %s", err)
                self._cpu = None
                return
            seconds = self._cpu.last_interval_s
            workers_time = self._cpu.last_workers_time
        if cpu and seconds > 0:
            with self._lock:
                self._window.add(cpu, seconds)
                self._run.add(cpu, seconds)
                self._workers_seen = max(self._workers_seen, workers)
                wall, busy, queue = workers_time
                self._workers_time[0] += wall
                self._workers_time[1] += busy
                if queue is None or self._workers_time[2] is None:
                    self._workers_time[2] = None
                else:
                    self._workers_time[2] += queue

    def _add(self, sample: dict[str, float], rows: Sequence[dict[str, float]] = ()) -> None:
        with self._lock:
            self._window.add(sample)
            self._run.add(sample)
            for stats, row in zip(self._device_stats, rows, strict=False):
                stats.add(row)

    def pause(self) -> None:
        """Stop keeping samples until :meth:`resume` (validation, a checkpoint, an epoch start began)."""
        self.paused = True

    def resume(self) -> None:
        """Keep samples again: a training step runs.

        The CPU counters kept counting through what the pause covered (setup, an epoch's start, validation, a
        checkpoint), which is not a training step: one read here, on the training thread once per pause (a few
        hundred microseconds), sets a new baseline and is not kept."""
        if self.paused:
            with self._cpu_lock:
                # an error here: the sampler thread's next read says why and stops the CPU figures
                if self._cpu is not None:
                    with contextlib.suppress(Exception):
                        self._cpu.read()
        self.paused = False

    def take_window(self) -> dict[str, float]:
        """Averages since the previous call (only metrics that have samples), and start a new window.

        The CPU is read here too, so every window has its CPU figures whatever the CPU cadence."""
        if self._opened:
            self._sample_cpu(force=True)
        with self._lock:
            window, self._window = self._window, Stats()
        return window.means()

    def summary(self) -> UtilizationSummary:
        """Run averages since start(); ``gpu`` is None when no GPU figure was measured."""
        with self._lock:
            run = self._run.means()
            peaks = [s.peaks[GPU_MEM_USED] for s in self._device_stats if GPU_MEM_USED in s.peaks]
            workers_seen = self._workers_seen
            workers_wall, workers_busy, workers_queue = self._workers_time
        gpu = None
        if any(key in run for key in GPU_KEYS):
            name = ", ".join(dict.fromkeys(self._gpu_names))
            # peak memory: of the fullest GPU, the one that runs out first
            gpu = gpu_figures(run, max(peaks, default=None), name, self._compute_capability)
        cpu = CpuUtilization(
            process_cpu_pct=run.get(CPU_UTIL),
            workers_cpu_pct=run.get(WORKERS_CPU),
            system_cpu_pct=run.get(SYSTEM_CPU),
            process_rss_gb=run.get(PROCESS_RSS),
            workers_rss_gb=run.get(WORKERS_RSS),
            num_workers_seen=workers_seen if CPU_UTIL in run else None,
            cpu_count=usable_cpu_count(),
        )
        if workers_wall > 0:
            cpu.workers_wall_s, cpu.workers_cpu_s, cpu.workers_runqueue_s = (
                workers_wall,
                workers_busy,
                workers_queue,
            )
        return UtilizationSummary(
            gpu=gpu,
            gpu_unavailable_reason=self.gpu_unavailable_reason,
            cpu=cpu,
            gpu_metrics_unavailable=dict(self.gpu_metrics_unavailable),
        )

    def device_summaries(self) -> list[GpuUtilization]:
        """Run averages per GPU in use, in ``cuda_devices`` order ([] when no GPU was measured)."""
        with self._lock:
            stats = [(s.means(), s.peaks.get(GPU_MEM_USED)) for s in self._device_stats]
        return [
            gpu_figures(means, peak, name, self._compute_capability)
            for (means, peak), name in zip(stats, self._gpu_names, strict=False)
            if means
        ]

    def gpu_clocks(self) -> tuple[float | None, float | None, dict[str, float]]:
        """The slowest GPU's average SM clock and its maximum (MHz), and per clock slowdown reason the largest
        share (%) of training samples in which it held some GPU's clocks down; (None, None, {}) without them."""
        with self._lock:
            per_device = [s.means() for s in self._device_stats]
        return clock_figures(per_device, self._max_sm_clock)
