"""CPU figures of the training process and its DataLoader workers through psutil, as rates between reads.

:class:`PsutilBackend` is what :class:`lightning_perf.collect.sampling.utilization.UtilSampler` reads on its thread for
the ``perf/*cpu*`` and ``perf/*rss*`` metrics; :func:`usable_cpu_count` is the cores this process may use.

It also keeps, per read, where the workers' wall time went (:attr:`PsutilBackend.last_workers_time`): on a CPU
(psutil's CPU times), runnable but waiting for a core (:func:`runqueue_seconds`, Linux schedstat), or neither
(waiting on storage, the network, a sleep, a lock). That is why a batch from the workers is late.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

from lightning_perf.analysis import metrics
from lightning_perf.analysis.numbers import BYTES_PER_GB

# psutil's children() reads /proc/<pid>/stat of every process on the machine: ~7 us each here, so a few ms
# on a GPU server running 500-1000 processes. Workers are rediscovered every 1 s, less often when a scan is
# slow, so that scanning takes at most 0.2% of the training process's time. A new worker is counted from
# the scan that finds it (as cpu_percent would), so its first second or less is missed.
CHILD_RESCAN_S = 1.0
CHILD_SCAN_MAX_SHARE = 0.002

# Children that multiprocessing starts for itself (spawn/forkserver start methods, DDP spawn): not DataLoader
# workers. Matched on their command line; a forkserver's own children (the workers) still count.
SERVICE_PROCESS_MARKERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")

CPU_UTIL = metrics.CPU_UTIL.tag
WORKERS_CPU = metrics.WORKERS_CPU.tag
SYSTEM_CPU = metrics.SYSTEM_CPU.tag
PROCESS_RSS = metrics.PROCESS_RSS.tag
WORKERS_RSS = metrics.WORKERS_RSS.tag


def _cpu_seconds(process: Any) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _system_busy_total(psutil: Any) -> tuple[float, float]:
    # psutil.cpu_percent's accounting, done here because that function keeps global state anyone may reset;
    # Linux already counts guest time in user and nice
    times = psutil.cpu_times()
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return total - times.idle - getattr(times, "iowait", 0.0), total


def runqueue_seconds(pid: int, tid: int | None = None) -> float | None:
    """Seconds thread ``tid`` of process ``pid`` (its main thread by default) has been runnable but waited for a
    core, from Linux's ``/proc/<pid>/task/<tid>/schedstat`` (on-CPU ns, run-queue ns, time slices); ``None`` where
    the file does not exist (other systems, kernels without schedstats). psutil does not expose it."""
    path = f"/proc/{pid}/schedstat" if tid is None else f"/proc/{pid}/task/{tid}/schedstat"
    try:
        with open(path, "rb") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _is_service_process(process: Any) -> bool:
    command = " ".join(process.cmdline())
    return any(marker in command for marker in SERVICE_PROCESS_MARKERS)


class PsutilBackend:
    """CPU time and resident memory of the training process and its workers, as rates between reads."""

    def __init__(self, psutil: Any, pid: int, exclude_pids: Iterable[int] = (), clock: Any = time.monotonic):
        self._psutil = psutil
        self._gone = (psutil.NoSuchProcess, psutil.AccessDenied)
        self._process = psutil.Process(pid)
        self._exclude = frozenset(exclude_pids)
        self._clock = clock
        # pid -> [psutil.Process, its CPU seconds, its run-queue seconds (None: unreadable), when they were read]
        self._workers: dict[int, list[Any]] = {}
        self._services: dict[int, Any] = {}  # pid -> psutil.Process of multiprocessing's own helpers
        self._last = (clock(), _cpu_seconds(self._process), *_system_busy_total(psutil))
        self.last_interval_s = 0.0
        # the workers' (wall, CPU, run-queue) seconds over the last read, summed over the live workers; run queue
        # None when some worker's schedstat could not be read
        self.last_workers_time: tuple[float, float, float | None] = (0.0, 0.0, None)
        self._rescan(self._last[0])

    def _rescan(self, now: float) -> None:
        started = time.perf_counter()
        try:
            children = self._process.children(recursive=True)
        except self._gone:
            children = []
        excluded = set(self._exclude)
        workers = {}
        for child in children:
            try:
                # children() lists a parent before its descendants: one pass excludes whole subtrees
                if excluded and (child.pid in excluded or child.ppid() in excluded):
                    excluded.add(child.pid)
                    continue
                if self._services.get(child.pid) == child:
                    continue
                entry = self._workers.get(child.pid)
                if entry is None or entry[0] != child:  # new, or its pid was reused: counted from now on
                    if _is_service_process(child):
                        self._services[child.pid] = child
                        continue
                    entry = [child, _cpu_seconds(child), runqueue_seconds(child.pid), now]
            except self._gone:
                continue
            workers[child.pid] = entry
        self._workers = workers
        cost = time.perf_counter() - started
        self._next_scan = now + max(CHILD_RESCAN_S, cost / CHILD_SCAN_MAX_SHARE)

    def read(self) -> tuple[dict[str, float], int]:
        """(CPU metrics over the time since the last read, number of live workers)."""
        now = self._clock()
        if now >= self._next_scan:
            self._rescan(now)
        last_time, last_cpu, last_busy, last_total = self._last
        if now <= last_time:
            return {}, len(self._workers)
        cpu = _cpu_seconds(self._process)
        workers_cpu = workers_wall = 0.0
        workers_queue: float | None = 0.0
        workers_rss = 0
        for pid, entry in list(self._workers.items()):
            try:
                worker_cpu = _cpu_seconds(entry[0])
                workers_rss += entry[0].memory_info().rss
            except self._gone:  # exited (or not ours to read) since the scan: forget it
                del self._workers[pid]
                continue
            workers_cpu += max(0.0, worker_cpu - entry[1])
            workers_wall += max(0.0, now - entry[3])
            queue = runqueue_seconds(pid)
            if workers_queue is not None and queue is not None and entry[2] is not None:
                workers_queue += max(0.0, queue - entry[2])
            else:
                workers_queue = None
            entry[1], entry[2], entry[3] = worker_cpu, queue, now
        busy, total = _system_busy_total(self._psutil)
        self.last_interval_s = now - last_time  # the seconds these rates cover
        self.last_workers_time = (workers_wall, workers_cpu, workers_queue if self._workers else 0.0)
        values = {
            CPU_UTIL: 100.0 * (cpu - last_cpu) / (now - last_time),
            WORKERS_CPU: 100.0 * workers_cpu / (now - last_time),
            PROCESS_RSS: self._process.memory_info().rss / BYTES_PER_GB,
            WORKERS_RSS: workers_rss / BYTES_PER_GB,
        }
        if total > last_total:  # no clock tick since the last read: nothing measured
            values[SYSTEM_CPU] = max(0.0, 100.0 * (busy - last_busy) / (total - last_total))  # no -1e-9
        self._last = (now, cpu, busy, total)
        return values, len(self._workers)


def usable_cpu_count() -> int:
    """CPU cores this process may run on (its affinity mask, e.g. under SLURM or taskset), else all cores."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
