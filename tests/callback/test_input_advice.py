"""The num_workers advice on real fits with loaders of known cost: storage that sleeps, per-sample CPU work, a fast
loader, and a machine busied by two CPU hogs. Each follows the advice where it says "more workers" and checks that
it was right. The probe is off here (``probe_num_workers="never"``): these test the measured model of the loading
(``rules/loading.py``); the probe is exercised by tune's test and tests/probes.

No timing asserts beyond effects many times larger than this machine's noise (sleeps are not CPU work, so a busy
machine does not change them much).
"""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_perf import PerfCallback
from lightning_perf.analysis.rules.inputs.loading import WAITS, loading_of
from lightning_perf.analysis.summary import RunSummary
from tests.helpers import FEATURES, TinyModel, loader, trainer
from tests.input_consistency import contradictions

STORAGE_DELAY_S = 0.010  # a slow disk or network storage: 10 ms a sample
BATCH = 4


def fit(tmp_path, data: DataLoader, steps: int, model=None) -> RunSummary:
    callback = PerfCallback(enable_profiler=False, probe_num_workers="never", ab_cudnn_benchmark=False)
    run = trainer(tmp_path, [callback], max_steps=steps, log_every_n_steps=10)
    run.fit(model or TinyModel(), data)
    summary = callback.last_summary
    assert not contradictions(summary), contradictions(summary)
    return summary


def advice(summary: RunSummary) -> dict:
    return {f.id: f for f in summary.findings}


def storage_fit(tmp_path, workers: int, steps: int | None = None) -> RunSummary:
    # about 2 s of training whatever the workers: the sampler finds new workers within 1 s
    steps = steps or {0: 50, 2: 100}.get(workers, 160)
    return fit(tmp_path, loader(BATCH * steps, BATCH, STORAGE_DELAY_S, workers), steps)


@pytest.mark.parametrize("workers", [0, 2, 4])
def test_slow_storage_gets_more_workers_never_cpu_bound_and_following_it_is_faster(tmp_path, workers):
    before = storage_fit(tmp_path / "before", workers)
    found = advice(before)
    advised = found["input_bound"].settings_change["num_workers"]
    assert advised >= max(2, 2 * workers) and advised > workers, found["input_bound"].recommendation
    assert loading_of(before).cause == WAITS
    assert "wait" in found["input_bound"].evidence
    assert "batched_transforms" not in found and "workers_exceed_cores" not in found
    assert not any("CPU-bound" in f.title for f in before.findings)

    after = storage_fit(
        tmp_path / "after", advised, steps=240
    )  # long enough that the workers ramp-up is not the mean
    speedup = before.timing.step_time_ms.mean / after.timing.step_time_ms.mean
    # from 4 workers on 2 cores every batch's hand-off already takes the training thread's core half the time
    # (its run-queue share measured 40-50%): 4 -> 16 measured 1.15-1.9x over 240 steps here, 0 or 2 -> 16 over 3x
    least = 1.6 if workers < 4 else 1.1
    assert speedup >= least, f"{workers} -> {advised} workers: {speedup:.2f}x"


def test_the_same_slow_storage_run_twice_gets_the_same_advice(tmp_path):
    first, second = (storage_fit(tmp_path / name, 0) for name in ("first", "second"))
    assert advice(first)["input_bound"].settings_change == advice(second)["input_bound"].settings_change


class CpuWork(Dataset):
    """Each sample burns ``cpu_s`` of CPU time (a decode or an augmentation), no sleep."""

    def __init__(self, n: int, cpu_s: float) -> None:
        self.n, self.cpu_s = n, cpu_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        end = time.thread_time() + self.cpu_s
        while time.thread_time() < end:
            pass
        return torch.zeros(FEATURES), torch.zeros(1)


class BusyModel(TinyModel):
    """A step that keeps one core busy for ``cpu_s`` (a model computing on the CPU)."""

    def __init__(self, cpu_s: float) -> None:
        super().__init__()
        self.cpu_s = cpu_s

    def training_step(self, batch, batch_idx):
        end = time.thread_time() + self.cpu_s
        while time.thread_time() < end:
            pass
        return super().training_step(batch, batch_idx)


def test_per_sample_cpu_work_with_a_free_cpu_gets_a_first_worker(tmp_path):
    """The model leaves the CPU free (its step sleeps, as a GPU step would): with 0 workers the loading is paid
    inside every step, so at least one worker overlaps it."""
    steps = 60
    data = DataLoader(CpuWork(BATCH * steps, 0.004), batch_size=BATCH)
    summary = fit(tmp_path, data, steps, model=TinyModel(step_delay_s=0.01))
    found = advice(summary)
    assert "the training thread's fetches" in found["input_bound"].evidence
    if summary.findings[0].id == "noisy_machine" and summary.findings[0].severity == "high":
        # others held the cores a loading that computes needs: no count sized on them (issue 42)
        assert "num_workers" not in found["input_bound"].settings_change
        assert "not measured" in found["input_bound"].recommendation
        return
    assert found["input_bound"].settings_change.get("num_workers", 0) >= 1, found["input_bound"]


def test_cpu_saturated_workers_get_batched_transforms_and_no_more_workers(tmp_path):
    """One worker computing all the time beside a model computing all the time fills the 2 cores. Where the
    machine was busy with other work the tool says that first and withholds the CPU-bound verdict instead."""
    steps = 60
    data = DataLoader(CpuWork(BATCH * steps, 0.008), batch_size=BATCH, num_workers=1)
    summary = fit(tmp_path, data, steps, model=BusyModel(0.015))
    found = advice(summary)
    assert "num_workers" not in found["input_bound"].settings_change
    assert found["input_bound"].title.endswith("input-bound") and "not" not in found["input_bound"].title
    if summary.findings[0].id == "noisy_machine" and summary.findings[0].severity == "high":
        assert "batched_transforms" not in found  # others held the cores: no CPU-bound verdict
    elif "batched_transforms" in found:
        assert found["batched_transforms"].settings_change == {"batched_transforms": True}
        assert "compute" in found["batched_transforms"].evidence
    else:
        # the cores were not full: on a quiet machine the model waits half of each step, so one saturated worker
        # and the model use ~1.5 of the 2 cores (here 1.47-1.49) and the worker is named saturated; or others
        # took part of the cores and the machine is named
        assert "workers_saturated" in found or "noisy_machine" in found, [f.id for f in summary.findings]


def test_fast_loader_gets_no_workers_advice(tmp_path):
    summary = fit(tmp_path, loader(BATCH * 60, BATCH), 60, model=TinyModel(step_delay_s=0.005))
    assert not any("num_workers" in f.settings_change for f in summary.findings)


def test_busy_machine_is_said_first_and_slow_storage_still_gets_workers(tmp_path, cpu_hogs):
    summary = storage_fit(tmp_path, 0)
    first = summary.findings[0]
    assert first.id == "noisy_machine" and first.severity == "high", [f.title for f in summary.findings]
    assert "other processes used" in first.evidence
    assert advice(summary)["input_bound"].settings_change["num_workers"] >= 2
    assert "batched_transforms" not in advice(summary)
