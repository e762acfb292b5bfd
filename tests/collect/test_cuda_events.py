"""The GPU's own account of a step: CUDA events at batch boundaries, through a fake with CUDA's semantics."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lightning_perf.collect.config import PerfConfig
from lightning_perf.collect.cuda_events import GPU_DATA_WAIT_PCT, CudaStepEvents
from lightning_perf.collect.profiling.profiler_window import ProfilerWindow
from lightning_perf.collect.run_state import PerfSession
from lightning_perf.collect.settings_fingerprint import collect_settings
from lightning_perf.collect.steps.step_clock import DATA_WAIT_PCT, StepClock


class FakeStream:
    """One CUDA stream and the host, on one clock (ms). Kernels run back to back in launch order, starting no
    earlier than the host launched them; an event completes when everything queued before it has run."""

    def __init__(self) -> None:
        self.host_ms = 0.0
        self.queued_until = 0.0
        self.syncs = 0

    def host(self, ms: float) -> None:
        self.host_ms += ms

    def launch(self, gpu_ms: float) -> None:
        self.queued_until = max(self.queued_until, self.host_ms) + gpu_ms

    def event(self) -> FakeEvent:
        return FakeEvent(self)


class FakeEvent:
    """``torch.cuda.Event(enable_timing=True)``'s methods: record (no sync), query, elapsed_time, synchronize."""

    def __init__(self, stream: FakeStream) -> None:
        self.stream = stream
        self.at: float | None = None

    def record(self) -> None:
        stream = self.stream
        self.at = max(stream.queued_until, stream.host_ms)
        stream.queued_until = self.at

    def query(self) -> bool:
        return self.at is not None and self.at <= self.stream.host_ms

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.query() and end.query(), "elapsed_time on an event the GPU has not reached raises in CUDA"
        return end.at - self.at

    def synchronize(self) -> None:
        self.stream.syncs += 1
        self.stream.host_ms = max(self.stream.host_ms, self.at)


def train(
    clock: StepClock, stream: FakeStream, steps: int, fetch_ms: float, gpu_ms: float, sync: bool
) -> None:
    """A loop as Lightning runs it: fetch (host), launch the step's kernels (host 1 ms), maybe sync."""
    clock.epoch_started()
    for _ in range(steps):
        boundary = stream.host_ms / 1e3
        clock.gpu_boundary()
        stream.host(fetch_ms)
        clock.batch(boundary, boundary, stream.host_ms / 1e3, 8)
        stream.launch(gpu_ms)
        stream.host(1.0)
        if sync:  # e.g. loss.item() every step
            stream.host_ms = max(stream.host_ms, stream.queued_until)
    clock.interrupt(stream.host_ms / 1e3)


def test_host_running_ahead_counts_wait_that_costs_the_gpu_nothing():
    stream = FakeStream()
    clock = StepClock(gpu=CudaStepEvents(stream.event))
    train(clock, stream, steps=40, fetch_ms=5.0, gpu_ms=20.0, sync=False)
    window = clock.take_window()
    assert stream.syncs == 0  # the window read only what had completed
    summary = clock.summary()
    assert summary.data_wait_pct > 80.0  # the host waited 5 of every 6 ms: "highly input-bound" on the host
    assert summary.gpu_data_wait_pct == pytest.approx(0.0, abs=0.5)  # the GPU never waited
    assert summary.gpu_compute_ms.median == pytest.approx(20.0)  # GPU time per step, not the host's 1 ms
    assert stream.syncs == 1  # the end of the run drains once
    assert window[DATA_WAIT_PCT] > 80.0


def test_a_sync_every_step_makes_the_fetch_gpu_idle_time():
    stream = FakeStream()
    clock = StepClock(gpu=CudaStepEvents(stream.event))
    train(clock, stream, steps=20, fetch_ms=5.0, gpu_ms=20.0, sync=True)
    window = clock.take_window()
    assert window[GPU_DATA_WAIT_PCT] == pytest.approx(100 * 5 / 25)  # 5 ms idle, then 20 ms of kernels
    summary = clock.summary()
    assert summary.gpu_data_wait_ms.median == pytest.approx(5.0)
    assert summary.gpu_data_wait_pct == pytest.approx(window[GPU_DATA_WAIT_PCT], rel=0.05)


def test_validation_gaps_and_epoch_starts_are_not_steps():
    stream = FakeStream()
    events = CudaStepEvents(stream.event)
    clock = StepClock(gpu=events)
    train(clock, stream, steps=5, fetch_ms=2.0, gpu_ms=10.0, sync=True)
    stream.host(500.0)  # validation: the GPU idles, but not for input
    train(clock, stream, steps=5, fetch_ms=2.0, gpu_ms=10.0, sync=True)
    clock.summary()
    assert max(events.idle_ms) == pytest.approx(2.0)  # the 500 ms gap and epoch starts are in no figure
    assert len(events.idle_ms) == 8 and len(events.step_ms) == 8  # 4 measured steps per epoch


def test_events_only_on_cuda(monkeypatch):
    assert CudaStepEvents.for_device(torch.device("cpu")) is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert CudaStepEvents.for_device(torch.device("cuda", 0)) is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert isinstance(CudaStepEvents.for_device(torch.device("cuda", 0)), CudaStepEvents)


def test_session_records_the_boundary_before_the_fetch():
    stream = FakeStream()
    events = CudaStepEvents(stream.event)
    session = PerfSession("fit", StepClock(gpu=events), None)
    session.clock.epoch_started()
    for _ in range(3):
        session.before_fetch(0.0)
        stream.host(4.0)  # the fetch: the GPU has nothing queued
        session.after_fetch(0.0, 0.004, (torch.zeros(2, 3), 0, 0))
        stream.launch(6.0)
        stream.host_ms = stream.queued_until
    events.read_completed()
    assert list(events.idle_ms) == [pytest.approx(4.0)] * 2
    assert session.loader_yields_cuda is False


def test_memory_timeline_is_exported_for_the_ranks_own_device(tmp_path, monkeypatch):
    seen = []
    from lightning_perf.traces import exports

    monkeypatch.setattr(exports, "export_memory_timeline", lambda prof, path, device: seen.append(device))
    config = PerfConfig(profile_memory=True, record_shapes=True, with_stack=True, export_stacks=False)
    window = ProfilerWindow(config, ("cpu", "cuda"), str(tmp_path), global_rank=3, device="cuda:3")
    window._write_exports(None, str(tmp_path / "trace"), str(tmp_path / "trace.json"))
    assert seen == ["cuda:3"]


def test_settings_fingerprint_has_compute_capability_and_matmul_precision_from_torch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA Fake H100")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        fake_trainer = SimpleNamespace(
            strategy=SimpleNamespace(root_device=torch.device("cuda", 0), strategy_name="ddp"),
            precision="32-true",
            num_devices=1,
            world_size=1,
            accumulate_grad_batches=1,
            lightning_module=None,
        )
        settings = collect_settings(fake_trainer, None, loader_yields_cuda=True)
    finally:
        torch.set_float32_matmul_precision(previous)
    assert settings.compute_capability == [9, 0]
    assert settings.float32_matmul_precision == "high"
    assert settings.matmul_allow_tf32 is True  # "high" turns TF32 matmuls on
    assert settings.loader_yields_cuda is True
