"""Real fits too short for a verdict (issue 25, point 3): a fit that fails after its first steps says it was too
short for an input-bound verdict, and a short leaky fit says memory rose but was too short to judge."""

from __future__ import annotations

import logging

import pytest

from lightning_perf import PerfCallback
from lightning_perf.analysis.rules.thresholds import MIN_STEPS_FOR_VERDICT, VERDICTS
from lightning_perf.analysis.summary import RunSummary
from tests.callback.test_memory_growth import LeakyModel
from tests.helpers import TinyModel, loader, trainer


def test_a_fit_that_fails_at_its_first_steps_is_too_short_for_a_verdict(tmp_path, caplog):
    callback = PerfCallback(enable_profiler=False, probe_num_workers="never")
    L_trainer = trainer(tmp_path, [callback], limit_train_batches=20)
    with (
        caplog.at_level(logging.INFO, logger="lightning_perf"),
        pytest.raises(RuntimeError, match="injected"),
    ):
        # a slow loader: a long enough run would be highly input-bound
        L_trainer.fit(TinyModel(fail_at_batch=2), loader(n=80, delay_s=0.004))
    summary = RunSummary.load(L_trainer.logger.log_dir)
    assert summary.status == "failed" and 1 <= summary.timing.steps < MIN_STEPS_FOR_VERDICT
    (finding,) = [f for f in summary.findings if f.id == "input_bound"]
    assert finding.title == "Too short for an input-bound verdict"
    assert (
        f"{summary.timing.steps} steps were timed" in finding.evidence
        or "1 step was timed" in finding.evidence
    )
    assert "DataLoader wait is" in finding.evidence  # what was measured
    assert not any(v in caplog.text for v in VERDICTS)
    assert "lightning-perf: Too short for an input-bound verdict" in caplog.text


def test_a_short_leaky_fit_says_memory_rose_but_too_short_to_judge(tmp_path):
    callback = PerfCallback(enable_profiler=False, util_interval_s=0.005, probe_num_workers="never")
    L_trainer = trainer(tmp_path, [callback], limit_train_batches=6, limit_val_batches=0)
    L_trainer.fit(LeakyModel(), loader(n=24))
    summary = RunSummary.load(L_trainer.logger.log_dir)
    readings = len(summary.memory.steps)
    assert 2 <= readings < 10, summary.memory
    (found,) = [f for f in summary.findings if f.id == "memory_growth"]
    assert found.title == "Too short to judge memory growth", found
    assert f"in {readings} readings (" in found.evidence and "Process RSS rose" in found.evidence
