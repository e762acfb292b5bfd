"""``import pytorch_lightning as pl`` and ``import lightning.pytorch as pl`` get the same callback behaviour."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_perf import PerfCallback
from lightning_perf.analysis.summary import RunSummary
from tests.compat.namespace_fits import fit_trainer, pl, quick_callback, tiny_model  # noqa: F401
from tests.helpers import loader


def test_the_callback_is_a_callback_of_both_namespaces(pl):  # noqa: F811
    assert isinstance(PerfCallback(), pl.Callback)


def test_a_fit_writes_everything_to_tensorboard(pl, tmp_path):  # noqa: F811
    callback = quick_callback()
    trainer = fit_trainer(pl, tmp_path, [callback], logger=pl.loggers.TensorBoardLogger(str(tmp_path)))
    trainer.fit(tiny_model(pl), loader(n=48))
    log_dir = trainer.logger.log_dir
    summary = RunSummary.load(os.path.join(log_dir, "perf_summary.json"))
    assert summary.timing.steps > 0 and summary.findings
    assert (
        summary.settings.lightning_version == importlib.import_module(pl.__name__.split(".")[0]).__version__
    )
    events = EventAccumulator(log_dir, size_guidance={"tensors": 0})
    events.Reload()
    tags = events.Tags()
    assert "perf_step/time_ms" in tags["scalars"]
    assert any(tag.startswith("perf_summary/") for tag in tags["scalars"])
    assert any(tag.startswith("perf_text/diagnosis") for tag in tags["tensors"])
    plugins = events.PluginTagToContent
    assert "custom_scalars__config__" in plugins("custom_scalars")
    hparams = plugins("hparams")
    assert "_hparams_/session_start_info" in hparams
    assert b"perf/accelerator" in hparams["_hparams_/session_start_info"]


def test_the_pytorch_profiler_conflict_is_caught(pl, tmp_path):  # noqa: F811
    trainer = fit_trainer(pl, tmp_path, [quick_callback()], profiler="pytorch", logger=False)
    with pytest.raises(ValueError, match="PyTorchProfiler"):
        trainer.fit(tiny_model(pl), loader(n=16))


def test_dataloader_iter_steps_report_step_time_without_a_wait(pl, tmp_path):  # noqa: F811
    class IterModel(tiny_model(pl).__class__):
        def training_step(self, dataloader_iter):
            batch, _, _ = next(dataloader_iter)
            return super().training_step(batch, 0)

    callback = quick_callback(enable_profiler=False)
    fit_trainer(pl, tmp_path, [callback], logger=False).fit(IterModel(), loader(n=48))
    timing = callback.last_summary.timing
    assert timing.steps >= 8 and timing.step_time_ms.median > 0
    assert timing.data_wait_ms is None and timing.data_wait_pct is None


def test_importing_the_callback_leaves_lightnings_logging_alone():
    # a fresh interpreter: `lightning` user, pytorch_lightning installed but not imported by them
    code = (
        "import lightning.pytorch, lightning_utilities.core.rank_zero as r; import lightning_perf.callback; "
        "import pytorch_lightning; print(r.log.name)"
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "lightning.pytorch.utilities.rank_zero"
