"""MemoryRecorder: RSS of this process for real, the GPU allocator through mocked torch.cuda functions (the
hardware boundary; no GPU here), NVML through the fake, and the series through the sampler into a diagnosis."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lightning_perf.analysis.diagnosis import diagnose
from lightning_perf.analysis.summary import RunSummary
from lightning_perf.collect.sampling import memory_trend
from lightning_perf.collect.sampling.memory_trend import MemoryRecorder, cgroup_memory, ram_capacity
from lightning_perf.collect.sampling.utilization import UtilSampler
from tests.fake_nvml import four_gpus

MB = 10**6


class Steps:
    """A global step the test moves on by hand."""

    def __init__(self) -> None:
        self.step = 0

    def __call__(self) -> int:
        return self.step


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda's memory functions on a scripted 80 GB device: ``state.allocated`` bytes live now."""
    state = SimpleNamespace(allocated=2_000 * MB, peak=3_000 * MB, fail=False, devices=[])

    def allocated(device):
        state.devices.append(device)
        if state.fail:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return state.allocated

    monkeypatch.setattr(torch.cuda, "memory_allocated", allocated)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: state.peak)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=80 * 10**9)
    )
    return state


def test_one_reading_per_new_step_with_its_step_and_no_gpu_series_without_a_gpu():
    steps = Steps()
    recorder = MemoryRecorder(steps)
    for step in (0, 0, 1, 1, 1, 2, 5):
        steps.step = step
        recorder.read()
    recorder.finish()
    series = recorder.series(0.1)
    assert series.steps == [0, 1, 2, 5]
    assert len(series.process_rss_mb) == 4 and all(v > 10 for v in series.process_rss_mb)  # this process
    assert series.gpu_allocated_mb == [] and series.gpu_unavailable_reason == "no GPU in use"
    assert series.ram_total_gb > 0 and 0 < series.ram_available_gb <= series.ram_total_gb
    assert series.gpu_total_gb is None and series.gpu_peak_allocated_gb is None and series.interval_s == 0.1


def test_the_series_stays_bounded_and_evenly_spread_over_a_long_run():
    steps = Steps()
    recorder = MemoryRecorder(steps, limit=50)
    for step in range(1000):
        steps.step = step
        recorder.read()
    series = recorder.series()
    assert len(series.steps) <= 50
    gaps = {b - a for a, b in zip(series.steps, series.steps[1:], strict=False)}
    assert len(gaps) == 1 and series.steps[0] == 0 and series.steps[-1] >= 900  # the whole run, evenly
    assert len(recorder._series.steps) < 100  # never more than twice the limit held


def test_gpu_allocated_memory_of_the_trained_device_and_its_capacity(fake_cuda):
    steps = Steps()
    recorder = MemoryRecorder(steps, cuda_device=1)
    for step in range(3):
        steps.step = step
        fake_cuda.allocated = (2_000 + 50 * step) * MB
        recorder.read()
    recorder.finish()
    series = recorder.series()
    assert series.gpu_allocated_mb == [2000.0, 2050.0, 2100.0]
    assert set(fake_cuda.devices) == {1} and series.gpu_device == 1
    assert series.gpu_total_gb == 80.0 and series.gpu_peak_allocated_gb == 3.0
    assert series.gpu_unavailable_reason is None


def test_a_gpu_error_mid_run_ends_the_gpu_series_not_the_rss_one(fake_cuda):
    steps = Steps()
    recorder = MemoryRecorder(steps, cuda_device=0)
    recorder.read()
    fake_cuda.fail = True
    steps.step = 1
    recorder.read()
    steps.step = 2
    recorder.read()
    series = recorder.series()
    assert series.steps == [0, 1, 2]
    assert series.gpu_allocated_mb == [2000.0, None, None]  # absent, not zero
    assert None not in series.process_rss_mb
    assert "illegal memory access" in series.gpu_unavailable_reason


def test_a_step_source_that_fails_costs_a_reading_not_the_sampler():
    def broken() -> int:
        raise AttributeError("fit_loop")

    recorder = MemoryRecorder(broken)
    recorder.read()
    assert recorder.series().steps == []


def test_the_cgroup_limit_is_the_capacity_when_lower_than_the_machine(tmp_path):
    limit, usage = tmp_path / "memory.max", tmp_path / "memory.current"
    limit.write_text("max\n")
    usage.write_text("123\n")
    files = ((str(limit), str(usage)),)
    assert cgroup_memory(files) is None  # v2 without a limit
    limit.write_text(f"{4 * 10**9}\n")
    usage.write_text(f"{3 * 10**9}\n")
    assert cgroup_memory(files) == (4 * 10**9, 3 * 10**9)
    assert cgroup_memory(((str(tmp_path / "none"), str(usage)),)) is None


def test_ram_capacity_takes_the_lower_of_machine_and_cgroup(monkeypatch):
    machine = SimpleNamespace(virtual_memory=lambda: SimpleNamespace(total=64 * 10**9, available=60 * 10**9))
    monkeypatch.setattr(memory_trend, "cgroup_memory", lambda: (8 * 10**9, 5 * 10**9))
    assert ram_capacity(machine) == (8.0, 3.0)
    monkeypatch.setattr(memory_trend, "cgroup_memory", lambda: (2**63 - 4096, 10**9))  # v1: unlimited
    assert ram_capacity(machine) == (64.0, 60.0)
    monkeypatch.setattr(memory_trend, "cgroup_memory", lambda: None)
    assert ram_capacity(machine) == (64.0, 60.0)


def test_the_sampler_reads_memory_in_steps_only_and_a_gpu_leak_reaches_the_diagnosis(fake_cuda):
    """The GPU path end to end: fake NVML, mocked allocator, the sampler's series, the diagnosis."""
    nvml = four_gpus()
    fake_cuda.peak = 4_000 * MB  # inside a step, above any reading between
    steps = Steps()
    sampler = UtilSampler(
        3600.0,
        [0],
        nvml=nvml,
        cuda_uuid_lookup=lambda i: nvml.gpus[i].uuid,
        cpu_interval_s=0.0,
        memory=MemoryRecorder(steps, cuda_device=0),
    )
    try:
        for step in range(60):
            steps.step = step
            fake_cuda.allocated = (2_000 + 30 * step) * MB  # 30 MB kept every step
            sampler.sample_once()
        sampler.pause()  # validation: not read
        steps.step = 60
        fake_cuda.allocated = 50_000 * MB
        sampler.sample_once()
        sampler.resume()
    finally:
        sampler.stop()
    series = sampler.memory.series(sampler.interval_s)
    assert series.steps == list(range(60)) and max(series.gpu_allocated_mb) == 3770.0
    summary = RunSummary(utilization=sampler.summary(), memory=series)
    finding = next(f for f in diagnose(summary) if f.id == "memory_growth")
    assert finding.title == "GPU memory grows step after step"
    assert "GPU memory (allocated) rises 30 MB a step" in finding.evidence
    assert (
        "the 76.0 GB left of the 80.0 GB device is used up in ~2533 steps" in finding.evidence
    )  # 76 GB / 30 MB
    assert finding.severity == "medium"  # >= 1 MB a step, the device full only in 40x the steps run
