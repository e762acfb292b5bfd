"""Following the workers advice never makes a run slower (issue 42): each loader of the input tests, diagnosed by a
real fit, its advice applied, and both settings timed in real fits taken in turns (A B B A), on the mean step with
each epoch's start counted in.

The advice is the input findings' settings changes (``num_workers``, ``prefetch_factor``, ``persistent_workers``).
Where a loader gets none, there is nothing to follow; the test needs advice on at least the loaders built to get it.
The allowance is 5% (the issue's), on medians of two fits a side taken in turns: the advice these loaders get moves
the step by 1.3x and more, so the check is many times this machine's noise. A round the tool found busy (other
processes held the cores) excuses a slower step: the advice is for the machine it measured.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from lightning_perf import PerfCallback
from lightning_perf.analysis.summary import RunSummary
from tests.callback.test_input_advice import STORAGE_DELAY_S, BusyModel, CpuWork
from tests.callback.test_worker_handoff import PoolModel
from tests.helpers import SleepyDataset, TinyModel, trainer
from tests.input_consistency import contradictions

ADVICE_KEYS = ("num_workers", "prefetch_factor", "persistent_workers")
ALLOWED_SLOWDOWN = 1.05


@dataclass
class Case:
    dataset: Callable[[], Dataset]
    batch_size: int
    settings: dict[str, Any]
    steps: int
    model: Callable[[], Any] = TinyModel
    epochs: int | None = None  # whole epochs instead of a step count (restarting workers)
    expect_advice: bool = True
    trainer_options: dict[str, Any] = field(default_factory=dict)


def large_in_memory() -> Dataset:
    return TensorDataset(torch.randn(16 * 40, 3, 256, 256), torch.randn(16 * 40, 1))


CASES = {
    # in-memory tensors, batch 4, a tiny model: told nothing (a worker made it 4.4x slower)
    "in_memory_0_workers": Case(
        lambda: SleepyDataset(4 * 300, 0.0), 4, {"num_workers": 0}, 300, expect_advice=False
    ),
    # a batch of 2 cheap samples with 2 workers: told fewer
    "batch_2_with_2_workers": Case(lambda: SleepyDataset(2 * 400, 0.0), 2, {"num_workers": 2}, 400),
    # 12.6 MB in-memory batches with 2 workers: told 0
    "large_in_memory_2_workers": Case(large_in_memory, 16, {"num_workers": 2}, 40, model=PoolModel),
    # slow storage with 0 workers: told more workers
    "slow_storage_0_workers": Case(lambda: SleepyDataset(4 * 60, STORAGE_DELAY_S), 4, {"num_workers": 0}, 60),
    # per-sample CPU work, the model leaving the CPU free: told a first worker
    "cpu_work_free_core": Case(
        lambda: CpuWork(4 * 60, 0.004), 4, {"num_workers": 0}, 60, model=lambda: TinyModel(step_delay_s=0.01)
    ),
    # one saturated worker beside a computing model: never more workers
    "saturated_worker": Case(
        lambda: CpuWork(4 * 50, 0.008),
        4,
        {"num_workers": 1},
        50,
        model=lambda: BusyModel(0.015),
        expect_advice=False,
    ),
    # workers restarting every short epoch: told persistent_workers=True
    "restarting_workers": Case(
        lambda: SleepyDataset(4 * 8, 0.0),
        4,
        {"num_workers": 2},
        0,
        model=lambda: TinyModel(step_delay_s=0.03),
        epochs=10,
    ),
}


def run(tmp_path, case: Case, settings: dict[str, Any]) -> RunSummary:
    data = DataLoader(case.dataset(), batch_size=case.batch_size, **settings)
    callback = PerfCallback(enable_profiler=False, probe_num_workers="never", ab_cudnn_benchmark=False)
    length = {"max_epochs": case.epochs} if case.epochs else {"max_steps": case.steps}
    trainer(tmp_path, [callback], log_every_n_steps=10, **length).fit(case.model(), data)
    summary = callback.last_summary
    assert not contradictions(summary), contradictions(summary)
    return summary


def advice(summary: RunSummary) -> dict[str, Any]:
    """What the input findings tell the run to set, merged (contradictions are checked apart)."""
    merged: dict[str, Any] = {}
    for finding in summary.findings:
        merged.update({k: v for k, v in finding.settings_change.items() if k in ADVICE_KEYS})
    return merged


def wall_step_ms(summary: RunSummary) -> float:
    """The mean step with each epoch's start (its first fetch, which the step figures leave out) counted in."""
    timing = summary.timing
    total = timing.step_time_ms.mean * timing.step_time_ms.count
    if timing.epoch_start_ms is not None:
        total += timing.epoch_start_ms.mean * timing.epoch_start_ms.count
    return total / timing.step_time_ms.count


def busy(summary: RunSummary) -> bool:
    return any(f.id == "noisy_machine" and f.severity == "high" for f in summary.findings)


@pytest.mark.once  # ~5 fits a loader; what advice follows from a summary does not depend on Lightning's version
@pytest.mark.parametrize("name", list(CASES))
def test_following_the_workers_advice_never_makes_the_step_slower(tmp_path, name):
    case = CASES[name]
    diagnosis = run(tmp_path / "diagnosis", case, case.settings)
    change = advice(diagnosis)
    if not change:
        assert not case.expect_advice or busy(diagnosis), [f.recommendation for f in diagnosis.findings]
        return
    if "num_workers" in change:  # never more workers beside the loaders that hand over more than they load
        assert case.expect_advice or change["num_workers"] <= case.settings["num_workers"], change
    followed = {**case.settings, **change}
    if followed.get("num_workers", 0) == 0:  # a DataLoader takes these only with workers
        followed = {k: v for k, v in followed.items() if k not in ("prefetch_factor", "persistent_workers")}
    before, after, disturbed = [], [], []
    for index, (side, settings) in enumerate(
        [(before, case.settings), (after, followed), (after, followed), (before, case.settings)]
    ):
        timed = run(tmp_path / f"round{index}", case, settings)
        side.append(wall_step_ms(timed))
        disturbed += [index] if busy(timed) else []
    ratio = statistics.median(after) / statistics.median(before)
    said = f"{case.settings} -> {followed}: the step went from {before} to {after} ms ({ratio:.2f}x as long)"
    # others holding the cores change what workers cost (more processes get more of a contended machine): the
    # advice is for the machine it measured, so a round the tool itself found busy excuses the difference
    assert ratio <= ALLOWED_SLOWDOWN or disturbed, said
