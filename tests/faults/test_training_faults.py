"""Faults in the training itself, at every batch of a profiling cycle, and inside the trace export.

The user's own error must reach the user, the profiler and sampler must be off, and what was measured before
the fault (traces, the summary) must be on disk and whole.
"""

from __future__ import annotations

import logging
import os

import pytest

from lightning_perf import PerfCallback
from tests.faults.checks import BATCHES, CYCLE, QUIET, check_all, seeded_fit
from tests.helpers import TinyModel

pytestmark = pytest.mark.slow
# batch 0 skipped, 1 waited, 2 warm-up, 3-4 recorded, saved when batch 5 starts, 6-7 after the cycle
POSITIONS = range(BATCHES)


class FailingModel(TinyModel):
    fail_at: int | None = None
    interrupt = False

    def __init__(self):
        super().__init__(fail_at_batch=self.fail_at, interrupt=self.interrupt)


def failing(at: int, interrupt: bool) -> type[FailingModel]:
    return type("Failing", (FailingModel,), {"fail_at": at, "interrupt": interrupt})


@pytest.mark.parametrize("at", POSITIONS)
def test_an_exception_at_every_batch_reaches_the_user(tmp_path, at):
    callback = PerfCallback(**CYCLE, **QUIET)
    with pytest.raises(RuntimeError, match="injected failure"):
        seeded_fit(tmp_path, [callback], model_cls=failing(at, interrupt=False))
    summary = check_all(callback.last_summary.log_dir, callback)
    assert summary is not None and summary.status == "failed" and summary.timing.steps == at
    assert len(summary.traces) == (1 if at >= 3 else 0)  # a cycle cut short keeps the steps it recorded


@pytest.mark.parametrize("at", POSITIONS)
def test_a_keyboard_interrupt_at_every_batch_ends_the_fit_and_keeps_what_was_measured(
    tmp_path, at, restore_sigint
):
    callback = PerfCallback(**CYCLE, **QUIET)
    with pytest.raises(SystemExit):  # Lightning's answer to Ctrl-C: a graceful shutdown, then exit(1)
        seeded_fit(tmp_path, [callback], model_cls=failing(at, interrupt=True))
    summary = check_all(callback.last_summary.log_dir, callback)
    assert summary is not None and summary.status == "interrupted"
    assert len(summary.traces) == (1 if at >= 3 else 0)


@pytest.mark.parametrize(
    "fault", [RuntimeError("export broke"), KeyboardInterrupt()], ids=["error", "ctrl-c"]
)
@pytest.mark.parametrize("where", ["torch export", "rewrite"])
def test_a_fault_inside_the_trace_export(
    tmp_path, monkeypatch, caplog, restore_sigint, reference_weights, fault, where
):
    import torch

    from lightning_perf.traces.read import reader

    def broken(*args, **kwargs):
        raise fault

    if where == "torch export":
        monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", broken)
    else:
        monkeypatch.setattr(reader, "rewrite_trace", broken)
    callback = PerfCallback(**CYCLE, **QUIET)
    if isinstance(fault, KeyboardInterrupt):
        with pytest.raises(SystemExit):
            seeded_fit(tmp_path, [callback])
        assert callback.last_summary.status == "interrupted"
    else:
        with caplog.at_level(logging.WARNING, logger="lightning_perf"):
            fit_trainer, model = seeded_fit(tmp_path, [callback])
        assert fit_trainer.state.finished
        assert all(a.equal(b) for a, b in zip(model.parameters(), reference_weights, strict=True))
        if where == "rewrite":  # the trace torch wrote is kept, unmodified
            assert len(callback.last_summary.traces) == 1
        else:
            assert callback.last_summary.traces == []
            assert sum("could not write the trace" in r.getMessage() for r in caplog.records) == 1
    check_all(callback.last_summary.log_dir, callback)
    assert not [n for n in os.listdir(callback.last_summary.log_dir) if n.startswith(".")]
