"""UtilSampler: NVML through a fake module (no GPU here), psutil through a fake and for real (child processes)."""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import sys
import threading
import time
from collections import namedtuple
from types import SimpleNamespace

import pytest

from lightning_perf.collect.sampling import cpu_sampler, utilization
from lightning_perf.collect.sampling.cpu_sampler import (
    CPU_UTIL,
    SYSTEM_CPU,
    WORKERS_CPU,
    PsutilBackend,
)
from lightning_perf.collect.sampling.nvml import GPU_MEM_USED, GPU_MEM_UTIL, GPU_POWER, GPU_UTIL
from lightning_perf.collect.sampling.utilization import UtilSampler
from tests.fake_nvml import (
    FakeGpu,
    FakeNvml,
    NVMLError_DriverNotLoaded,
    NVMLError_GpuIsLost,
    NVMLError_LibraryNotFound,
    four_gpus,
)

LONG_INTERVAL_S = 3600.0  # the thread never samples on its own: the test drives sample_once()


def torch_style_uuids(nvml: FakeNvml, visible: list[int]):
    """The CUDA index -> UUID lookup torch gives under CUDA_VISIBLE_DEVICES=<visible>: bare UUIDs, no "GPU-"."""
    return lambda cuda_index: nvml.gpus[visible[cuda_index]].uuid.removeprefix("GPU-")


def gpu_keys(metrics: dict[str, float]) -> list[str]:
    return [key for key in metrics if key.startswith("perf_gpu/")]


@pytest.fixture
def sampler_factory():
    """Builds samplers and stops every one of them at the end, whatever the test did."""
    made: list[UtilSampler] = []

    def make(*args, **kwargs) -> UtilSampler:
        kwargs.setdefault("cpu_interval_s", 0.0)  # tests drive sample_once and want the CPU read every time
        made.append(UtilSampler(*args, **kwargs))
        return made[-1]

    yield make
    for sampler in made:
        sampler.stop()


# --- construction ---


@pytest.mark.parametrize("bad", [0, -0.1, math.nan, math.inf, "0.1", True, None])
def test_interval_must_be_a_positive_number(bad):
    with pytest.raises(ValueError, match="interval_s"):
        UtilSampler(interval_s=bad)


@pytest.mark.parametrize("bad", [[-1], ["0"], [0.5], [True]])
def test_cuda_devices_must_be_indices(bad):
    with pytest.raises(ValueError, match="cuda_devices"):
        UtilSampler(cuda_devices=bad)


def test_pid_must_be_positive():
    with pytest.raises(ValueError, match="pid"):
        UtilSampler(pid=0)


# --- device mapping ---


def test_cuda_index_maps_to_the_nvml_device_with_its_uuid_when_visible_devices_reorder(sampler_factory):
    nvml = four_gpus()
    for i, gpu in enumerate(nvml.gpus):
        gpu.util = [10 * (i + 1)]  # NVML device i reads 10*(i+1) %, so the reading names the device
    lookup = torch_style_uuids(nvml, visible=[2, 0])  # CUDA_VISIBLE_DEVICES=2,0
    first = sampler_factory(LONG_INTERVAL_S, [0], nvml=nvml, cuda_uuid_lookup=lookup)
    second = sampler_factory(LONG_INTERVAL_S, [1], nvml=nvml, cuda_uuid_lookup=lookup)
    first.sample_once()
    second.sample_once()
    assert first.nvml_uuids == [nvml.gpus[2].uuid]
    assert first.take_window()[GPU_UTIL] == 30.0
    assert second.nvml_uuids == [nvml.gpus[0].uuid]
    assert second.take_window()[GPU_UTIL] == 10.0


def test_hidden_devices_and_nvml_style_uuids(sampler_factory):
    nvml = four_gpus()
    nvml.gpus[3].util = [77]
    # CUDA_VISIBLE_DEVICES=3 hides NVML devices 0-2; a lookup giving NVML's own "GPU-..." form, upper case
    sampler = sampler_factory(
        LONG_INTERVAL_S, [0], nvml=nvml, cuda_uuid_lookup=lambda i: nvml.gpus[3].uuid.upper()
    )
    sampler.sample_once()
    assert sampler.nvml_uuids == [nvml.gpus[3].uuid]
    assert sampler.take_window()[GPU_UTIL] == 77.0
    assert sampler.summary().gpu.device_name == "NVIDIA Fake A100"


def test_pci_address_matches_when_the_uuid_does_not(sampler_factory):
    nvml = four_gpus()
    nvml.gpus[1].util = [55]
    sampler = sampler_factory(
        LONG_INTERVAL_S,
        [0],
        nvml=nvml,
        cuda_uuid_lookup=lambda i: "0f0f0f0f-1111-2222-3333-444444444444",  # a UUID NVML does not know
        cuda_pci_lookup=lambda i: (0, 0x20, 0),  # NVML device 1's address
    )
    sampler.sample_once()
    assert sampler.nvml_uuids == [nvml.gpus[1].uuid]
    assert sampler.take_window()[GPU_UTIL] == 55.0
    assert nvml.enumerations == 0


# --- window and run averages ---


def test_window_averages_known_readings_and_resets(sampler_factory):
    nvml = FakeNvml(
        [
            FakeGpu(
                uuid="GPU-1",
                pci=(0, 1, 0),
                util=[10, 30, 50],
                mem_util=[5, 15, 25],
                mem_used=[1 * 10**9, 2 * 10**9, 6 * 10**9],
                power_mw=[100_000, 200_000, 300_000],
            )
        ]
    )
    sampler = sampler_factory(LONG_INTERVAL_S, [0], nvml=nvml, cuda_uuid_lookup=lambda i: "GPU-1")
    for _ in range(3):
        sampler.sample_once()
    window = sampler.take_window()
    assert window[GPU_UTIL] == pytest.approx(30.0)
    assert window[GPU_MEM_UTIL] == pytest.approx(15.0)
    assert window[GPU_MEM_USED] == pytest.approx(3.0)  # GB = 1e9 bytes
    assert window[GPU_POWER] == pytest.approx(200.0)  # mW -> W
    # nothing sampled on the GPU since: no GPU key at all, no zeros (take_window reads the CPU itself)
    assert gpu_keys(sampler.take_window()) == []
    sampler.sample_once()  # the fake repeats its last reading: 50 %
    assert sampler.take_window()[GPU_UTIL] == pytest.approx(50.0)
    gpu = sampler.summary().gpu
    assert gpu.util_pct == pytest.approx((10 + 30 + 50 + 50) / 4)  # the run spans every window
    assert gpu.peak_mem_used_gb == pytest.approx(6.0)
    assert gpu.compute_capability == [8, 0]
    assert sampler.gpu_unavailable_reason is None


def test_several_gpus_are_averaged_and_kept_per_device(sampler_factory):
    nvml = four_gpus()
    nvml.gpus[0].util, nvml.gpus[0].mem_used = [20], [4 * 10**9]
    nvml.gpus[1].util, nvml.gpus[1].mem_used = [60], [10 * 10**9]
    nvml.gpus[1].power_mw = None  # this board does not report power
    sampler = sampler_factory(
        LONG_INTERVAL_S, [0, 1], nvml=nvml, cuda_uuid_lookup=torch_style_uuids(nvml, [0, 1])
    )
    sampler.sample_once()
    sampler.sample_once()
    window = sampler.take_window()
    assert window[GPU_UTIL] == pytest.approx(40.0)
    assert window[GPU_MEM_USED] == pytest.approx(7.0)
    assert window[GPU_POWER] == pytest.approx(100.0)  # only the GPU that reports power
    assert sampler.summary().gpu.peak_mem_used_gb == pytest.approx(10.0)  # the fullest GPU
    first, second = sampler.device_summaries()
    assert (first.util_pct, first.power_w) == (pytest.approx(20.0), pytest.approx(100.0))
    assert (second.util_pct, second.power_w) == (pytest.approx(60.0), None)
    assert second.peak_mem_used_gb == pytest.approx(10.0)


def test_unsupported_power_is_absent_not_zero(sampler_factory, caplog):
    caplog.set_level(logging.INFO, logger="lightning_perf")
    nvml = FakeNvml([FakeGpu(uuid="GPU-1", pci=(0, 1, 0), util=[40], power_mw=None)])
    sampler = sampler_factory(LONG_INTERVAL_S, [0], nvml=nvml, cuda_uuid_lookup=lambda i: "GPU-1")
    sampler.sample_once()
    sampler.sample_once()
    window = sampler.take_window()
    assert GPU_POWER not in window
    assert window[GPU_UTIL] == 40.0
    assert sampler.summary().gpu.power_w is None
    assert sampler.gpu_unavailable_reason is None
    assert not caplog.records  # NOT_SUPPORTED is normal, not worth a line


def test_gpu_supporting_no_metric_is_reported_not_zero(sampler_factory, caplog):
    caplog.set_level(logging.INFO, logger="lightning_perf")
    nvml = FakeNvml([FakeGpu(uuid="GPU-1", pci=(0, 1, 0), util=None, mem_used=None, power_mw=None)])
    sampler = sampler_factory(LONG_INTERVAL_S, [0], nvml=nvml, cuda_uuid_lookup=lambda i: "GPU-1")
    sampler.sample_once()
    sampler.sample_once()
    assert gpu_keys(sampler.take_window()) == []
    assert sampler.summary().gpu is None
    assert "gives none" in sampler.summary().gpu_unavailable_reason
    assert nvml.init_count == 0
    assert len(caplog.records) == 1


# --- GPU unavailable ---


def _no_pynvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` now raises ImportError
    return None


UNAVAILABLE_CASES = {
    "no devices": (lambda mp: FakeNvml([]), None, "no GPU in use"),
    "empty devices": (lambda mp: FakeNvml([]), [], "no GPU in use"),
    "pynvml not installed": (_no_pynvml, [0], "pynvml"),
    "library not found": (
        lambda mp: FakeNvml([], init_error=NVMLError_LibraryNotFound()),
        [0],
        "NVML library not found",
    ),
    "driver not loaded": (
        lambda mp: FakeNvml([], init_error=NVMLError_DriverNotLoaded()),
        [0],
        "NVML error: Driver",
    ),
    "no matching device": (lambda mp: four_gpus(), [0], "CUDA device 0"),
}


@pytest.mark.parametrize("case", list(UNAVAILABLE_CASES))
def test_gpu_unavailable_means_one_info_line_no_gpu_keys_and_cpu_still_sampled(
    case, sampler_factory, monkeypatch, caplog
):
    caplog.set_level(logging.INFO, logger="lightning_perf")
    make_nvml, devices, reason = UNAVAILABLE_CASES[case]
    nvml = make_nvml(monkeypatch)
    sampler = sampler_factory(
        LONG_INTERVAL_S, devices, nvml=nvml, cuda_uuid_lookup=lambda i: "GPU-not-on-this-machine"
    )
    sampler.start()
    time.sleep(0.03)  # the machine-wide CPU counters tick every 10 ms
    sampler.sample_once()
    window = sampler.take_window()
    summary = sampler.summary()
    assert reason in sampler.gpu_unavailable_reason
    assert summary.gpu_unavailable_reason == sampler.gpu_unavailable_reason
    assert summary.gpu is None
    assert gpu_keys(window) == []
    assert CPU_UTIL in window and SYSTEM_CPU in window
    assert summary.cpu.process_cpu_pct is not None
    lines = [r for r in caplog.records if "GPU utilization not measured" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    if isinstance(nvml, FakeNvml):
        assert nvml.init_count == 0  # never initialised, or released again
        assert nvml.reads == 0


def test_no_gpu_in_use_does_not_touch_nvml(sampler_factory):
    class Untouchable:
        def __getattr__(self, name):
            raise AssertionError(f"NVML used without a GPU: {name}")

    sampler = sampler_factory(LONG_INTERVAL_S, None, nvml=Untouchable())
    sampler.start()
    sampler.sample_once()
    assert sampler.gpu_unavailable_reason == "no GPU in use"


def test_real_pynvml_on_a_machine_without_nvidia_driver(sampler_factory):
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("NVML works on this machine")
    sampler = sampler_factory(LONG_INTERVAL_S, [0], cuda_uuid_lookup=lambda i: "GPU-x")
    sampler.start()
    sampler.sample_once()
    assert sampler.gpu_unavailable_reason.startswith("NVML")
    assert gpu_keys(sampler.take_window()) == []


# --- NVML error mid-run ---


def test_nvml_error_mid_run_stops_gpu_figures_keeps_what_was_measured(sampler_factory, caplog):
    caplog.set_level(logging.INFO, logger="lightning_perf")
    nvml = FakeNvml([FakeGpu(uuid="GPU-1", pci=(0, 1, 0), util=[20, 40])])
    sampler = sampler_factory(LONG_INTERVAL_S, [0], nvml=nvml, cuda_uuid_lookup=lambda i: "GPU-1")
    sampler.start()
    sampler.sample_once()
    sampler.sample_once()
    nvml.read_error = NVMLError_GpuIsLost()
    sampler.sample_once()
    window = sampler.take_window()
    assert window[GPU_UTIL] == pytest.approx(30.0)  # the two real readings, nothing for the failed one
    assert "GPU is lost" in sampler.gpu_unavailable_reason
    reads = nvml.reads
    sampler.sample_once()
    sampler.sample_once()
    window = sampler.take_window()
    assert gpu_keys(window) == []
    assert CPU_UTIL in window  # CPU keeps going
    assert nvml.reads == reads  # NVML is not asked again
    assert nvml.init_count == 0  # and was released
    summary = sampler.summary()
    assert summary.gpu.util_pct == pytest.approx(30.0)  # what was measured before the error
    assert "GPU is lost" in summary.gpu_unavailable_reason
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "GPU is lost" in warnings[0].getMessage()


def test_nvml_error_on_the_thread_leaves_it_sampling_cpu(sampler_factory):
    nvml = FakeNvml([FakeGpu(uuid="GPU-1", pci=(0, 1, 0), util=[20])])
    sampler = sampler_factory(0.005, [0], nvml=nvml, cuda_uuid_lookup=lambda i: "GPU-1")
    sampler.start()
    _wait_for(lambda: nvml.reads >= 2)
    nvml.read_error = NVMLError_GpuIsLost()
    _wait_for(lambda: sampler.gpu_unavailable_reason is not None)
    sampler.take_window()  # may still hold readings from before the error
    _wait_for(lambda: _window_has_cpu_only(sampler))
    assert sampler.is_running()


def _window_has_cpu_only(sampler: UtilSampler) -> bool:
    window = sampler.take_window()
    assert gpu_keys(window) == []
    return CPU_UTIL in window


def _wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


# --- thread lifecycle ---


def _sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "lightning_perf-util-sampler"]


def test_stop_joins_the_thread_and_is_idempotent(sampler_factory):
    nvml = four_gpus()
    sampler = sampler_factory(0.005, [0], nvml=nvml, cuda_uuid_lookup=torch_style_uuids(nvml, [0]))
    sampler.stop()  # before start: nothing to do
    sampler.start()
    assert sampler.is_running()
    assert _sampler_threads()[0].daemon
    with pytest.raises(RuntimeError, match="already running"):
        sampler.start()
    _wait_for(lambda: nvml.reads >= 3)
    sampler.stop()
    assert not sampler.is_running()
    assert _sampler_threads() == []
    assert nvml.init_count == 0
    reads = nvml.reads
    time.sleep(0.03)
    assert nvml.reads == reads  # nothing samples after stop
    sampler.stop()  # again: no error
    assert sampler.summary().gpu.util_pct == 0.0  # figures stay readable (the fake reads 0 %)


def test_start_after_stop_is_a_new_run(sampler_factory):
    nvml = FakeNvml([FakeGpu(uuid="GPU-1", pci=(0, 1, 0), util=[90, 10])])
    sampler = sampler_factory(LONG_INTERVAL_S, [0], nvml=nvml, cuda_uuid_lookup=lambda i: "GPU-1")
    sampler.start()
    sampler.sample_once()
    sampler.stop()
    sampler.start()
    sampler.sample_once()
    sampler.stop()
    assert _sampler_threads() == []  # stop() wakes a thread waiting out a long interval
    assert sampler.summary().gpu.util_pct == 10.0
    assert nvml.init_count == 0


# --- CPU arithmetic on a fake psutil ---

SysTimes = namedtuple("SysTimes", "user system idle")


class FakeProcess:
    def __init__(
        self,
        ps: FakePsutil,
        pid: int,
        ppid: int,
        cpu: float = 0.0,
        rss: int = 0,
        command: str = "python train.py",
    ) -> None:
        self.ps, self.pid, self._ppid, self.cpu, self.rss = ps, pid, ppid, cpu, rss
        self.command = command
        self.error: Exception | None = None  # raised by every read once set

    def __eq__(self, other):
        return isinstance(other, FakeProcess) and other.pid == self.pid

    def _check(self):
        if self.error is not None:
            raise self.error

    def cpu_times(self):
        self._check()
        return SimpleNamespace(user=self.cpu * 0.75, system=self.cpu * 0.25)

    def memory_info(self):
        self._check()
        return SimpleNamespace(rss=self.rss)

    def ppid(self):
        return self._ppid

    def cmdline(self):
        self._check()
        return self.command.split()

    def children(self, recursive=False):
        assert recursive
        self.ps.children_calls += 1
        found, queue = [], [self.pid]
        while queue:
            parent = queue.pop(0)
            for proc in self.ps.procs.values():
                if proc._ppid == parent:
                    found.append(proc)
                    queue.append(proc.pid)
        return found


class FakePsutil:
    class NoSuchProcess(Exception):
        pass

    class AccessDenied(Exception):
        pass

    def __init__(self) -> None:
        self.procs: dict[int, FakeProcess] = {}
        self.system = SysTimes(0.0, 0.0, 0.0)
        self.children_calls = 0

    def add(
        self, pid: int, ppid: int, cpu: float = 0.0, rss: int = 0, command: str = "python train.py"
    ) -> FakeProcess:
        self.procs[pid] = FakeProcess(self, pid, ppid, cpu, rss, command)
        return self.procs[pid]

    def Process(self, pid: int) -> FakeProcess:  # noqa: N802 (psutil's name)
        if pid not in self.procs:
            raise self.NoSuchProcess(pid)
        return self.procs[pid]

    def cpu_times(self):
        return self.system


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_cpu_percentages_are_of_one_core_and_system_is_of_all():
    ps, clock = FakePsutil(), FakeClock()
    main = ps.add(10, 1, cpu=5.0, rss=2 * 10**9)
    a = ps.add(11, 10, cpu=1.0, rss=10**9)
    b = ps.add(12, 10, cpu=3.0, rss=10**9)
    backend = PsutilBackend(ps, 10, clock=clock)
    clock.now += 0.5
    main.cpu += 1.0  # two cores busy for 0.5 s
    a.cpu += 0.5  # one core
    b.cpu += 0.25  # half a core
    ps.system = SysTimes(user=1.0, system=0.5, idle=2.5)  # 4 cores for 1 s ... busy 1.5 of 4 core-seconds
    values, workers = backend.read()
    assert values[CPU_UTIL] == pytest.approx(200.0)
    assert values[WORKERS_CPU] == pytest.approx(150.0)  # primed at start: only the CPU since counts
    assert values[SYSTEM_CPU] == pytest.approx(37.5)
    assert values[cpu_sampler.PROCESS_RSS] == pytest.approx(2.0)
    assert values[cpu_sampler.WORKERS_RSS] == pytest.approx(2.0)
    assert workers == 2


def test_workers_are_rediscovered_periodically_and_counted_from_then():
    ps, clock = FakePsutil(), FakeClock()
    ps.add(10, 1)
    backend = PsutilBackend(ps, 10, clock=clock)
    assert ps.children_calls == 1
    new = ps.add(20, 10, cpu=0.0)  # a worker starts after the sampler did (a new epoch's workers)
    for _ in range(5):
        clock.now += 0.1
        new.cpu += 0.1
        values, workers = backend.read()
    assert ps.children_calls == 1  # no /proc scan on every sample
    assert workers == 0 and values[WORKERS_CPU] == 0.0
    clock.now += cpu_sampler.CHILD_RESCAN_S
    new.cpu += 0.5
    values, workers = backend.read()  # scans, finds the worker, takes its CPU time as the baseline
    assert ps.children_calls == 2
    assert workers == 1 and values[WORKERS_CPU] == 0.0
    clock.now += 0.1
    new.cpu += 0.05
    values, workers = backend.read()
    assert ps.children_calls == 2
    assert values[WORKERS_CPU] == pytest.approx(50.0)


def test_workers_that_exit_or_deny_access_are_dropped_silently(caplog):
    caplog.set_level(logging.DEBUG, logger="lightning_perf")
    ps, clock = FakePsutil(), FakeClock()
    ps.add(10, 1)
    gone = ps.add(11, 10)
    denied = ps.add(12, 10)
    alive = ps.add(13, 10)
    backend = PsutilBackend(ps, 10, clock=clock)
    gone.error = FakePsutil.NoSuchProcess(11)
    denied.error = FakePsutil.AccessDenied(12)
    clock.now += 0.1
    alive.cpu += 0.1
    values, workers = backend.read()
    assert workers == 1
    assert values[WORKERS_CPU] == pytest.approx(100.0)
    assert not caplog.records


def test_excluded_children_and_their_descendants_are_not_workers():
    ps, clock = FakePsutil(), FakeClock()
    ps.add(10, 1)
    rank = ps.add(30, 10)  # another local rank, started by rank 0's launcher
    rank_worker = ps.add(31, 30)
    worker = ps.add(40, 10)
    backend = PsutilBackend(ps, 10, exclude_pids=[30], clock=clock)
    clock.now += 1.0
    rank.cpu += 1.0
    rank_worker.cpu += 1.0
    worker.cpu += 0.25
    values, workers = backend.read()
    assert workers == 1
    assert values[WORKERS_CPU] == pytest.approx(25.0)


def test_sampler_counts_the_most_workers_alive_at_once(sampler_factory):
    ps = FakePsutil()
    ps.add(10, 1)
    ps.add(11, 10)
    ps.add(12, 10)
    sampler = sampler_factory(LONG_INTERVAL_S, None, psutil_module=ps, pid=10)
    sampler.start()
    sampler.sample_once()
    ps.procs[12].error = FakePsutil.NoSuchProcess(12)
    sampler.sample_once()
    cpu = sampler.summary().cpu
    assert cpu.num_workers_seen == 2
    assert cpu.cpu_count == len(os.sched_getaffinity(0))


# --- CPU on real processes ---


def _spin() -> None:
    # until terminated, not for a time: on a crowded machine the test's own process may get no core for longer
    # than any fixed spin, and children that had stopped spinning before the window read 0 % (a CI failure)
    while True:
        pass


def _idle() -> None:
    time.sleep(3600)  # until terminated


def _workers_cpu_of(target, sampler_factory) -> tuple[float, float, int]:
    """Start 2 child processes running ``target`` and sample for 0.6 s.

    Returns (the sampler's workers CPU %, the same figure from the children's own CPU times, workers seen).
    """
    import psutil

    context = multiprocessing.get_context(
        "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    )
    children = [context.Process(target=target, daemon=True) for _ in range(2)]
    for child in children:
        child.start()
    try:
        processes = [psutil.Process(child.pid) for child in children]
        cpu_before, started = sum(_cpu_s(p) for p in processes), time.monotonic()
        sampler = sampler_factory(0.05)
        sampler.start()
        time.sleep(0.6)
        sampler.stop()
        direct = 100.0 * (sum(_cpu_s(p) for p in processes) - cpu_before) / (time.monotonic() - started)
        cpu = sampler.summary().cpu
        return cpu.workers_cpu_pct, direct, cpu.num_workers_seen
    finally:
        for child in children:
            child.terminate()
            child.join()


def _cpu_s(process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def test_busy_child_processes_show_as_worker_cpu(sampler_factory):
    # two spinning children: up to 200 %; other load on a 2-core machine can leave them far less (a few % each
    # at a load of 35), so the figure is checked against the children's own CPU times over the same window,
    # which is the truth at any load
    workers_cpu, direct, seen = _workers_cpu_of(_spin, sampler_factory)
    assert seen == 2
    assert direct > 1.0  # they spun inside the window
    assert workers_cpu == pytest.approx(direct, rel=0.35, abs=5.0)


def test_idle_child_processes_show_near_zero_worker_cpu(sampler_factory):
    workers_cpu, _, seen = _workers_cpu_of(_idle, sampler_factory)
    assert seen == 2
    assert workers_cpu < 5.0


def test_multiprocessing_helpers_are_not_workers_but_forkserver_children_are():
    ps, clock = FakePsutil(), FakeClock()
    ps.add(10, 1, cpu=5.0)
    tracker = ps.add(
        11, 10, cpu=1.0, command="python -c from multiprocessing.resource_tracker import main;main(5)"
    )
    server = ps.add(12, 10, cpu=1.0, command="python -c from multiprocessing.forkserver import main; main(7)")
    worker = ps.add(13, 12, cpu=1.0)  # a DataLoader worker forked by the forkserver
    backend = PsutilBackend(ps, 10, clock=clock)
    clock.now += 1.0
    tracker.cpu += 0.5
    server.cpu += 0.5
    worker.cpu += 0.25
    values, live = backend.read()
    assert live == 1
    assert values[WORKERS_CPU] == pytest.approx(25.0)


def test_cpu_is_read_at_most_once_per_cpu_interval(sampler_factory):
    sampler = sampler_factory(interval_s=0.1, cpu_interval_s=None)
    assert sampler.cpu_interval_s == 1.0  # counters are cumulative: a read a second keeps the averages exact
    sampler.sample_once()
    reads = []
    real_read = sampler._cpu.read
    sampler._cpu.read = lambda: reads.append(1) or real_read()
    for _ in range(5):
        sampler.sample_once()
    assert reads == []
    sampler._next_cpu_read = 0.0  # as if the second had passed
    sampler.sample_once()
    assert reads == [1]


def test_cpu_interval_is_validated():
    with pytest.raises(ValueError, match="cpu_interval_s"):
        UtilSampler(cpu_interval_s=-1.0)


def test_cpu_figures_cover_training_steps_each_read_weighted_by_the_seconds_it_covers(monkeypatch):
    ps, clock = FakePsutil(), FakeClock()
    main = ps.add(10, 1, cpu=0.0)
    monkeypatch.setattr(utilization, "PsutilBackend", lambda *a, **k: PsutilBackend(*a, clock=clock, **k))
    sampler = UtilSampler(3600.0, [], psutil_module=ps, pid=10, cpu_interval_s=0.0)
    sampler.pause()  # as the callback does before the first batch
    sampler.sample_once()  # opens the backends; paused: nothing kept
    clock.now += 1.0
    main.cpu += 2.0  # setup (model, loggers, workers starting) at 200%: not a training step
    sampler.resume()  # a read that only sets the baseline
    clock.now += 1.0
    main.cpu += 0.5  # a second of training at 50%
    sampler.sample_once()
    clock.now += 0.1
    main.cpu += 0.1  # a window's end 0.1 s later, at 100%
    window = sampler.take_window()
    # (50% x 1 s + 100% x 0.1 s) / 1.1 s; equal weights would say 75%, the setup would pull it up further
    assert window[CPU_UTIL] == pytest.approx(600.0 / 11)
    assert sampler.summary().cpu.process_cpu_pct == pytest.approx(600.0 / 11)
    sampler.stop()
