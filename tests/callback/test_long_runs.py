"""Long runs, end to end with real fits: a loader or model that slows at a chosen step gets the ``slowdown``
finding at that step and an extra trace of the slow period; steady runs stay silent; ``lightning-perf capture``
makes a running fit record a cycle; stale and malformed capture requests are ignored with a warning."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading
import time

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader, Dataset

from lightning_perf import PerfCallback
from lightning_perf.analysis.summary import RunSummary
from lightning_perf.cli import main
from lightning_perf.collect.profiling.capture_request import REQUEST_FILENAME, RequestInbox, write_request
from tests.helpers import FEATURES, TinyModel, load_trace, step_spans, trainer

WINDOW = 5  # log_every_n_steps: steps per logging window
SLOW_FROM = 60  # the batch from which the loader or the model slows


class SlowingDataset(Dataset):
    """One sample a batch; each fetch sleeps ``fast_s``, and ``slow_s`` from batch ``slow_from`` on."""

    def __init__(self, n: int, fast_s: float, slow_s: float, slow_from: int | None) -> None:
        self.n, self.fast_s, self.slow_s, self.slow_from = n, fast_s, slow_s, slow_from
        self.fetched = 0
        self.x, self.y = torch.randn(n, FEATURES), torch.randn(n, 1)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        slow = self.slow_from is not None and self.fetched >= self.slow_from
        self.fetched += 1
        time.sleep(self.slow_s if slow else self.fast_s)
        return self.x[index], self.y[index]


class SlowingModel(TinyModel):
    """Its training step sleeps 25 ms more from batch ``slow_from`` on (the compute slows)."""

    def __init__(self, slow_from: int) -> None:
        super().__init__()
        self.slow_from = slow_from

    def training_step(self, batch, batch_idx):
        if batch_idx >= self.slow_from:
            time.sleep(0.025)
        return super().training_step(batch, batch_idx)


def callback(**kwargs) -> PerfCallback:
    options = dict(
        log_every_n_steps=WINDOW,
        log_min_interval_s=0.0,
        utilization=False,
        probe_num_workers="never",
        ab_cudnn_benchmark=False,
        log_hparams=False,
    )
    options.update(kwargs)
    return PerfCallback(**options)


def fit(tmp_path, model, dataset, batches: int, cb: PerfCallback):
    trainer(tmp_path, [cb], limit_train_batches=batches, limit_val_batches=0).fit(
        model, DataLoader(dataset, batch_size=1)
    )
    return cb.last_summary


def test_a_loader_slowing_at_step_k_gets_slowdown_at_k_and_a_trace_of_the_slow_period(
    tmp_path, caplog, capsys
):
    with caplog.at_level(logging.INFO):
        summary = fit(tmp_path, TinyModel(), SlowingDataset(200, 0.003, 0.030, SLOW_FROM), 150, callback())
    assert [abs(s.step - SLOW_FROM) <= WINDOW for s in summary.slowdowns] == [True]
    found = summary.slowdowns[0]
    assert found.ratio > 2 and found.after_wait_ms - found.before_wait_ms > 15
    (finding,) = [f for f in summary.findings if f.id == "slowdown"]
    assert f"From step {found.step}" in finding.evidence and "the input pipeline slowed" in finding.evidence
    extra = [t for t in summary.traces if "_slowdown." in t.path]
    assert len(extra) == 1 and extra[0].steps[0] >= SLOW_FROM  # recorded in the slow period
    assert os.path.exists(os.path.join(summary.log_dir, extra[0].path))
    assert f"lasting slowdown from step {found.step}" in caplog.text
    assert "recording one extra profiler cycle (slowdown)" in caplog.text
    events = EventAccumulator(summary.log_dir, size_guidance={"tensors": 0})
    events.Reload()
    assert any(tag.startswith("perf_text/events") for tag in events.Tags()["tensors"])
    # the report sets the slow period's cycle beside the first one, component by component
    capsys.readouterr()
    assert main(["report", summary.log_dir, "--format", "json"]) == 0
    (change,) = json.loads(capsys.readouterr().out)["changes"]
    assert change["label"] == "slowdown" and change["file"] == extra[0].path
    rows = {row["category"]: row for row in change["rows"]}
    assert rows["dataloader"]["change_ms"] > 15 and rows["total"]["change_ms"] > 15
    assert main(["report", summary.log_dir]) == 0
    assert "What changed (slowdown cycle" in capsys.readouterr().out


def test_a_model_slowing_at_step_k_is_named_as_compute_without_an_extra_trace_when_off(tmp_path):
    cb = callback(profile_on_slowdown=False)
    summary = fit(tmp_path, SlowingModel(SLOW_FROM), SlowingDataset(200, 0.003, 0.003, None), 150, cb)
    assert [abs(s.step - SLOW_FROM) <= WINDOW for s in summary.slowdowns] == [True]
    (finding,) = [f for f in summary.findings if f.id == "slowdown"]
    assert "the training step itself slowed" in finding.evidence
    assert "lightning-perf capture" in finding.recommendation
    assert not [t for t in summary.traces if "_slowdown." in t.path]


def test_steady_real_fits_stay_silent(tmp_path):
    alarms = []
    for seed in range(3):
        torch.manual_seed(seed)
        summary = fit(
            tmp_path / str(seed), TinyModel(), SlowingDataset(200, 0.010, 0.010, None), 150, callback()
        )
        alarms += summary.slowdowns
    assert alarms == []


class WaitsForCapture(TinyModel):
    """Blocks at batch ``at`` until ``released`` is set (by the thread that ran ``lightning-perf capture``)."""

    def __init__(self, at: int, released: threading.Event) -> None:
        super().__init__()
        self.at, self.released = at, released

    def training_step(self, batch, batch_idx):
        if batch_idx == self.at:
            assert self.released.wait(120), "lightning-perf capture never ran"
        return super().training_step(batch, batch_idx)


def test_capture_makes_a_running_fit_record_a_cycle_and_a_stale_request_is_ignored(tmp_path, caplog):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_request(str(run_dir), now=time.time() - 3600)  # left over from an earlier run: stale
    cb = callback(log_every_n_steps=10, dirpath=str(run_dir))
    released, result = threading.Event(), {}

    def ask() -> None:  # as a user would, from another shell, once the fit runs and took the stale request
        deadline = time.monotonic() + 120
        while cb._fit is None or os.path.exists(run_dir / REQUEST_FILENAME):
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        env = dict(os.environ, PYTHONPATH=os.getcwd())
        command = [sys.executable, "-c", "from lightning_perf.cli import main; raise SystemExit(main())"]
        result["cli"] = subprocess.run(
            [*command, "capture", str(run_dir)], capture_output=True, text=True, env=env
        )
        released.set()

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    with caplog.at_level(logging.INFO):
        summary = fit(
            tmp_path, WaitsForCapture(25, released), SlowingDataset(100, 0.002, 0.002, None), 60, cb
        )
    asker.join(10)
    assert result["cli"].returncode == 0 and "record one profiler cycle" in result["cli"].stdout
    assert "ignoring the capture request" in caplog.text and "before this run started" in caplog.text
    assert "capture requested" in caplog.text
    captured = [t for t in summary.traces if "_capture." in t.path]
    assert len(captured) == 1 and captured[0].steps[0] >= 30  # the window after the request (batch 30)
    assert not os.path.exists(run_dir / REQUEST_FILENAME)


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"{not json", "malformed"),
        (json.dumps({"schema": "other", "version": 1, "requested_at": 0}).encode(), "is not"),
        (json.dumps({"schema": "lightning-perf/capture-request", "version": 1}).encode(), "malformed"),
    ],
)
def test_a_malformed_request_is_ignored_with_one_warning_and_removed(tmp_path, caplog, content, reason):
    (tmp_path / REQUEST_FILENAME).write_bytes(content)
    inbox = RequestInbox(str(tmp_path), started=time.time())
    with caplog.at_level(logging.WARNING):
        assert inbox.take() is None
    assert "ignoring the capture request" in caplog.text and reason in caplog.text
    assert not (tmp_path / REQUEST_FILENAME).exists()


def test_an_old_request_is_stale_and_a_fresh_one_is_taken_once(tmp_path, caplog):
    started = time.time()
    inbox = RequestInbox(str(tmp_path), started=started - 7200)
    write_request(str(tmp_path), now=started - 3600)
    with caplog.at_level(logging.WARNING):
        assert inbox.take() is None
    assert "60 minutes old" in caplog.text
    write_request(str(tmp_path))
    assert inbox.take() is not None and inbox.take() is None


@pytest.mark.timeout(300)
def test_under_ddp_every_rank_records_the_slowdown_cycle_at_the_same_batch(tmp_path):
    """Two real processes (gloo, ddp_spawn): rank zero decides from the gathered windows, both ranks record."""
    cb = callback()
    run = trainer(
        tmp_path,
        [cb],
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        limit_train_batches=180,
        limit_val_batches=0,
    )
    run.fit(TinyModel(), DataLoader(SlowingDataset(360, 0.003, 0.030, SLOW_FROM), batch_size=1))
    run_dir = os.path.join(str(tmp_path), "lightning_logs", "version_0")
    summary = RunSummary.load(run_dir)
    events = EventAccumulator(run_dir)
    events.Reload()
    windows = [(e.step, round(e.value, 1)) for e in events.Scalars("perf_step/time_ms")]
    assert [abs(s.step - SLOW_FROM) <= WINDOW for s in summary.slowdowns] == [True], windows
    extra = sorted(name for name in os.listdir(run_dir) if "_slowdown." in name)
    assert [re.search(r"_rank(\d)_slowdown\.", name).group(1) for name in extra] == ["0", "1"]
    steps = [[s["name"] for s in step_spans(load_trace(os.path.join(run_dir, name)))] for name in extra]
    assert steps[0] == steps[1] and len(steps[0]) == 3
