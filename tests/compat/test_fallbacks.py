"""Where a Lightning internal we lean on is missing (a future version renamed it), the callback falls back with
one warning naming what is lost, and the fit completes."""

from __future__ import annotations

import os
import sys
import warnings

import lightning.pytorch as L
import pytest
from lightning.pytorch.loops.fit_loop import _FitLoop
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_perf.analysis.summary import SUMMARY_FILENAME, RunSummary
from tests.compat.namespace_fits import fit_trainer, quick_callback, tiny_model
from tests.helpers import loader


def hide_from_lightning_perf(monkeypatch, cls: type, name: str) -> None:
    """Lightning keeps using ``cls.<name>``; lightning-perf's own code finds no such attribute, as on a Lightning
    version that renamed it."""
    stored = f"_kept{name}"

    def get(self):
        if sys._getframe(1).f_globals.get("__name__", "").startswith("lightning_perf"):
            raise AttributeError(name)
        return self.__dict__.get(stored)

    def put(self, value):
        self.__dict__[stored] = value

    monkeypatch.setattr(cls, name, property(get, put), raising=False)


def perf_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if str(w.message).startswith("lightning-perf")]


def test_without_the_loop_fetcher_steps_are_timed_from_the_batch_hooks(tmp_path, monkeypatch):
    hide_from_lightning_perf(monkeypatch, _FitLoop, "_data_fetcher")
    callback = quick_callback(log_every_n_steps=4)
    trainer = fit_trainer(L, tmp_path, [callback], max_epochs=2, limit_train_batches=8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(tiny_model(L), loader(n=64))
    (message,) = [m for m in perf_warnings(caught) if "_data_fetcher" in m]
    assert "Lost: DataLoader wait, compute time and epoch start-up time" in message
    timing = callback.last_summary.timing
    assert timing.steps >= 12 and timing.epochs == 2
    assert timing.step_time_ms.median > 0 and timing.data_wait_ms is None
    assert callback.last_summary.traces, "the profiling schedule still runs on the hook's boundaries"
    saved = RunSummary.load(os.path.join(trainer.logger.log_dir, SUMMARY_FILENAME))
    assert saved.timing.steps == timing.steps


def test_without_the_hp_metric_switch_the_fit_warns_and_completes(tmp_path):
    logger = L.loggers.TensorBoardLogger(str(tmp_path))
    del logger._default_hp_metric  # a version without the attribute
    callback = quick_callback(enable_profiler=False)
    with pytest.warns(UserWarning, match="no `_default_hp_metric`"):
        fit_trainer(L, tmp_path, [callback], logger=logger).fit(tiny_model(L), loader(n=32))
    assert os.path.isfile(os.path.join(logger.log_dir, SUMMARY_FILENAME))


def test_without_lightnings_hparams_helpers_our_hparams_are_still_written(tmp_path, monkeypatch):
    import lightning.fabric.utilities.logger as fabric_logger

    monkeypatch.delattr(fabric_logger, "_flatten_dict")
    logger = L.loggers.TensorBoardLogger(str(tmp_path), default_hp_metric=False)
    callback = quick_callback(enable_profiler=False)
    with pytest.warns(UserWarning, match="without your own hyperparameters"):
        fit_trainer(L, tmp_path, [callback], logger=logger).fit(tiny_model(L), loader(n=32))
    events = EventAccumulator(logger.log_dir)
    events.Reload()
    start = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    assert b"perf/accelerator" in start


def test_the_training_dataloader_is_read_through_the_public_property(tmp_path, monkeypatch):
    hide_from_lightning_perf(monkeypatch, _FitLoop, "_combined_loader")
    callback = quick_callback(enable_profiler=False)
    fit_trainer(L, tmp_path, [callback], logger=False).fit(tiny_model(L), loader(n=32, batch_size=4))
    assert callback.last_summary.settings.num_workers == 0
    assert callback.last_summary.settings.batch_size == 4


def test_reloaded_dataloaders_are_timed_in_every_epoch(tmp_path):
    class Reloading(L.LightningDataModule):
        def train_dataloader(self):
            return loader(n=32, delay_s=0.002)

    callback = quick_callback(enable_profiler=False, log_every_n_steps=2)
    trainer = fit_trainer(
        L, tmp_path, [callback], logger=False, max_epochs=3, reload_dataloaders_every_n_epochs=1
    )
    trainer.fit(tiny_model(L), datamodule=Reloading())
    timing = callback.last_summary.timing
    assert timing.epochs == 3
    # every epoch's first batch is start-up; the other 7 batches of each of the 3 epochs are timed steps
    assert timing.steps == 3 * 7
    assert timing.data_wait_ms is not None and timing.data_wait_ms.median >= 2.0
