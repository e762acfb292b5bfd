"""The step's anatomy covers the steps the step clock timed, and nothing else (issue 54): not the fit's first
batch (the epoch's start-up, where the FLOPs are counted), not a batch the clock dropped, not what runs after the
step ended (validation, the epoch's end). Real fits with PerfCallback at its defaults."""

from __future__ import annotations

import time
from time import perf_counter

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.loops.fit_loop import _FitLoop

from lightning_perf import PerfCallback
from lightning_perf.analysis.compute.anatomy import LOOP
from tests.compat.test_fallbacks import hide_from_lightning_perf
from tests.helpers import TinyModel, loader

BATCHES = 48


class SlowFirstBatch(TinyModel):
    """Every training_step sleeps 2 ms, the fit's first 300 ms (a warm-up: lazy initialisation, autotuning); the
    model times each of its own steps."""

    def __init__(self) -> None:
        super().__init__()
        self.forward_ms: list[float] = []

    def training_step(self, batch, batch_idx):
        started = perf_counter()
        time.sleep(0.3 if not self.forward_ms else 0.002)
        self.forward_ms.append((perf_counter() - started) * 1e3)
        return super().training_step(batch, batch_idx)


def default_fit(tmp_path, model, **kwargs) -> PerfCallback:
    """A Trainer at its defaults (progress bar, checkpoints, logger, sanity check, validation each epoch)."""
    callback = PerfCallback()
    options = dict(default_root_dir=str(tmp_path), max_epochs=1, callbacks=[callback], **kwargs)
    L.Trainer(**options).fit(model, loader(n=4 * BATCHES), loader(n=16))
    return callback


def test_the_anatomy_holds_the_timed_steps_and_its_parts_fit_in_the_step(tmp_path):
    model = SlowFirstBatch()
    summary = default_fit(tmp_path, model).last_summary
    timing, anatomy = summary.timing, summary.anatomy
    # the fit's first batch (its FLOPs counted, 300 ms slept) is the epoch's start-up: no step of the clock's
    assert timing.steps == BATCHES - 1
    assert anatomy.steps == timing.steps
    assert anatomy.step_ms == timing.step_time_ms.mean
    # the forward part is the timed steps' training_step: 2 ms, not 2 ms plus the first batch's 300 ms spread over
    # the steps (+6 ms). The part also holds the matmul and what a busy machine adds around the sleep
    timed = sum(model.forward_ms[1:]) / timing.steps
    forward = anatomy.parts_ms["forward"]
    assert timed <= forward <= timed + max(1.0, 0.25 * timed), (timed, anatomy.parts_ms)
    # the parts the hooks measured fit in the step: what they leave is Lightning's loop, more than nothing
    named = sum(ms for part, ms in anatomy.parts_ms.items() if part != LOOP)
    assert named < anatomy.step_ms, anatomy.parts_ms
    assert anatomy.parts_ms[LOOP] > 0.0


class SlowValidationLogger(TensorBoardLogger):
    """Sleeps 20 ms in each write of validation metrics (the model logs nothing else)."""

    writes = 0

    def log_metrics(self, metrics, step=None):
        if any(tag.startswith("val_") for tag in metrics):
            SlowValidationLogger.writes += 1
            time.sleep(0.02)
        super().log_metrics(metrics, step)


def test_what_runs_after_a_step_ends_is_no_part_of_it(tmp_path):
    # validation every 8 batches: its logger writes are validation's time, not the interrupted step's (before,
    # 6 writes of 20 ms over 47 steps put 2.5 ms a step in the loggers' part)
    SlowValidationLogger.writes = 0
    logger = SlowValidationLogger(str(tmp_path))
    summary = default_fit(tmp_path, TinyModel(), logger=logger, val_check_interval=8).last_summary
    assert SlowValidationLogger.writes >= 6
    assert summary.timing.validation_s >= SlowValidationLogger.writes * 0.02
    assert summary.anatomy.steps == summary.timing.steps
    assert summary.anatomy.parts_ms["loggers"] < 0.5, summary.anatomy.parts_ms


def test_where_the_batch_hooks_time_the_steps_the_flop_count_batch_is_dropped(tmp_path, monkeypatch):
    # a Lightning without the loop's fetcher: the fit's first batch is an ordinary step there, and its FLOPs are
    # counted under FlopCounterMode's Python dispatch, so it is dropped from the figures and the anatomy alike
    hide_from_lightning_perf(monkeypatch, _FitLoop, "_data_fetcher")
    model = SlowFirstBatch()
    summary = default_fit(tmp_path, model).last_summary
    assert summary.compute_limit is not None and summary.compute_limit.step.batch == 0
    assert summary.timing.steps == BATCHES - 1
    assert summary.anatomy.steps == summary.timing.steps
    assert summary.timing.step_time_ms.max < 150.0  # the 300 ms batch is in no step
