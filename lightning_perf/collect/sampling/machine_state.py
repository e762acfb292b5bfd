"""MachineWatch: what else the machine did while a run measured, from two readings (start and end).

CPU time of other processes is the machine's busy CPU time (``psutil.cpu_times()``, i.e. ``/proc/stat`` on
Linux) minus this process's and its children's (DataLoader workers, live or already reaped), over the wall
time between the readings. Steal time (a hypervisor running other guests) comes from the same counters. The
1-minute load average and the CPU frequency are read at the end where the platform has them. The training
thread's run-queue time (runnable, but waiting for a core: Linux schedstat) says whether the others took cores
this run needed, which busy counters alone cannot: an idle core beside a busy one costs the run nothing. Two readings
cost well under a millisecond and nothing runs in between: no thread, nothing on the training's path.

GPU clocks and clock slowdown ("throttle") reasons are sampled by the NVML sampler (``collect/sampling/nvml.py``) during
the training steps; :func:`with_gpu_clocks` adds its figures to the state.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from lightning_perf.analysis.summary import MachineState
from lightning_perf.collect.sampling.cpu_sampler import runqueue_seconds


@dataclass
class _Reading:
    wall: float
    busy_s: float
    total_s: float
    steal_s: float
    own_s: float
    thread_queue_s: float | None = None


def _own_cpu_seconds(process: Any) -> float:
    """This process's CPU time plus its children's: reaped ones (``children_*``) and live ones."""
    times = process.cpu_times()
    seconds = times.user + times.system + getattr(times, "children_user", 0.0)
    seconds += getattr(times, "children_system", 0.0)
    for child in process.children(recursive=True):
        try:
            child_times = child.cpu_times()
        except Exception:  # psutil.NoSuchProcess / AccessDenied: the child is gone or not ours to read
            continue
        seconds += child_times.user + child_times.system
    return seconds


def _read(psutil: Any, process: Any, thread_id: int | None = None) -> _Reading:
    times = psutil.cpu_times()
    # psutil.cpu_percent's accounting: Linux already counts guest time in user and nice
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    idle = times.idle + getattr(times, "iowait", 0.0)
    queue = runqueue_seconds(process.pid, thread_id) if thread_id is not None else None
    return _Reading(
        time.monotonic(), total - idle, total, getattr(times, "steal", 0.0), _own_cpu_seconds(process), queue
    )


class MachineWatch:
    """Start at the beginning of a run, :meth:`finish` at its end; never raises (a missing figure is None).

    The thread that creates it is the one whose run-queue time is measured (the training thread)."""

    def __init__(self) -> None:
        self._psutil: Any = None
        self._process: Any = None
        self._start: _Reading | None = None
        self._thread_id = threading.get_native_id()
        try:
            import psutil

            self._psutil, self._process = psutil, psutil.Process(os.getpid())
            self._start = _read(psutil, self._process, self._thread_id)
        except Exception:  # psutil missing or /proc unreadable: the run goes on without these figures
            self._start = None

    def finish(self) -> MachineState | None:
        """The machine's state between the start and now; ``None`` when the counters could not be read."""
        if self._start is None:
            return None
        try:
            end = _read(self._psutil, self._process, self._thread_id)
        except Exception:
            return None
        return machine_state(self._start, end, self._psutil.cpu_count() or None, self._psutil)


def machine_state(start: _Reading, end: _Reading, cpu_count: int | None, psutil: Any) -> MachineState:
    wall = end.wall - start.wall
    state = MachineState(wall_s=wall, cpu_count=cpu_count)
    total = end.total_s - start.total_s
    if wall > 0 and total > 0:
        own = max(0.0, end.own_s - start.own_s)
        # busy core-seconds / wall seconds = cores busy; the counters' ticks (10 ms) make tiny runs coarse
        busy_cores = (end.busy_s - start.busy_s) / total * (cpu_count or 1)
        state.own_cores = own / wall
        state.other_cores = max(0.0, busy_cores - state.own_cores)
        state.steal_pct = 100.0 * (end.steal_s - start.steal_s) / total
        if start.thread_queue_s is not None and end.thread_queue_s is not None:
            state.train_thread_runqueue_pct = (
                100.0 * max(0.0, end.thread_queue_s - start.thread_queue_s) / wall
            )
    with contextlib.suppress(AttributeError, OSError):  # no load average on Windows
        state.load_avg_1m = os.getloadavg()[0]
    try:
        freq = psutil.cpu_freq()
        if freq is not None and freq.current:
            state.cpu_freq_mhz = float(freq.current)
            state.cpu_freq_max_mhz = float(freq.max) if freq.max else None
    except Exception:  # not readable in this container or platform
        pass
    return state


def with_gpu_clocks(state: MachineState | None, sampler: Any) -> MachineState | None:
    """``state`` with the utilization sampler's GPU clock figures (a new state when CPU counters were not read)."""
    try:
        clock, top, slowdown = sampler.gpu_clocks()
    except Exception:  # a sampler that never opened NVML: nothing to add
        return state
    if clock is None and not slowdown:
        return state
    state = state if state is not None else MachineState()
    state.gpu_sm_clock_mhz, state.gpu_sm_clock_max_mhz = clock, top
    state.gpu_slowdown_pct = {reason: share for reason, share in slowdown.items() if share > 0}
    return state
