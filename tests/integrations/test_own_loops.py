"""A loop that drives its batches its own way: every epoch one batch (neuralforecast's loader yields whole
series a batch and samples its windows inside ``training_step``, so a small panel is one batch an epoch). The
epoch's first batch used to be left out as start-up, so such a fit timed no step ("no timing data"); now, once
an epoch ended with no step but its first, each later epoch's first batch is a step. No library needed."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_perf import PerfCallback
from lightning_perf.collect.steps.step_clock import StepClock


def one_batch_epochs(namespace: str, tmp_path) -> dict:
    pl = pytest.importorskip(namespace, reason=f"{namespace} is not installed")

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            (x,) = batch
            windows = x[torch.randint(0, len(x), (16,))]  # the loop's own sampling inside the step
            return self.layer(windows).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    loader = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=8)  # one batch an epoch
    callback = PerfCallback(dirpath=str(tmp_path), enable_profiler=False, utilization=False)
    trainer = pl.Trainer(
        max_steps=12,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(Model(), loader)
    return callback.last_summary.timing


@pytest.mark.parametrize("namespace", ["lightning.pytorch", "pytorch_lightning"])
def test_a_fit_of_one_batch_epochs_times_every_step_but_the_first(namespace, tmp_path):
    timing = one_batch_epochs(namespace, tmp_path)
    assert timing.epochs == 12 and timing.steps == 11  # the first epoch's batch is the fit's start-up
    assert timing.step_time_ms is not None and timing.step_time_ms.count == 11
    assert timing.data_wait_pct is not None and 0.0 <= timing.data_wait_pct <= 100.0
    assert timing.epoch_start_ms.count == 12  # each epoch's start-up is still reported apart


def test_an_epoch_of_one_batch_among_longer_ones_changes_nothing():
    clock = StepClock()
    t = 0.0
    for batches in (3, 1, 3):  # a short last epoch of a longer run: its first batch stays start-up
        clock.epoch_started()
        for _ in range(batches):
            clock.batch(t, t, t + 0.001, 4)
            t += 0.01
        clock.interrupt(t)
    assert clock.steps == 4 and clock.summary().epoch_start_ms.count == 3


def test_the_step_of_a_one_batch_epoch_pays_its_start_up():
    clock = StepClock()
    t = 0.0
    for _ in range(3):
        clock.epoch_started()
        clock.iterator_created(0.02)  # the workers' start: every step of such a loop pays it
        clock.batch(t, t, t + 0.005, 4)
        clock.interrupt(t + 0.010)
        t += 1.0
    summary = clock.summary()
    assert summary.steps == 2
    assert summary.step_time_ms.median == pytest.approx(30.0)  # iterator 20 + fetch 5 + compute 5
    assert summary.data_wait_ms.median == pytest.approx(25.0)
