"""Other profilers and other PerfCallbacks, a resumed fit, SIGTERM, NVML failing mid-run, Ctrl-C in a probe."""

from __future__ import annotations

import os
import signal
import time
import warnings

import lightning as L
import psutil
import pytest
import torch

from lightning_perf import PerfCallback
from lightning_perf.analysis.summary import SUMMARY_FILENAME, RunSummary
from lightning_perf.collect.sampling import utilization
from lightning_perf.errors import ConfigError
from lightning_perf.traces.read.reader import iter_events
from tests.fake_nvml import FakeGpu, FakeNvml, NVMLError_GpuIsLost
from tests.faults.checks import BATCHES, CYCLE, QUIET, TIMED_STEPS, check_all, seeded_fit
from tests.helpers import SleepyDataset, TinyModel, loader, trainer

pytestmark = pytest.mark.slow


def test_a_users_profiler_around_fit_keeps_every_event(tmp_path, reference_weights):
    callback = PerfCallback(**CYCLE, **QUIET)
    with torch.profiler.profile() as theirs:
        torch.ones(4).add_(1)  # recorded before fit: must survive our cycles
        with pytest.warns(UserWarning, match="another torch profiler is already recording") as caught:
            fit_trainer, model = seeded_fit(tmp_path, [callback])
    assert sum("another torch profiler" in str(w.message) for w in caught) == 1
    names = {event.name for event in theirs.events()}
    assert "aten::add_" in names and "aten::mse_loss" in names  # before fit and during it: nothing emptied
    assert callback.last_summary.traces == [] and callback.last_summary.timing.steps == TIMED_STEPS
    assert all(a.equal(b) for a, b in zip(model.parameters(), reference_weights, strict=True))
    check_all(fit_trainer.log_dir, callback)


def test_a_second_perf_callback_is_an_error_before_any_batch(tmp_path):
    model = TinyModel()
    with pytest.raises(ConfigError, match="holds 2 PerfCallbacks"):
        trainer(tmp_path, [PerfCallback(**QUIET), PerfCallback(**QUIET)], limit_train_batches=4).fit(
            model, loader()
        )
    assert model.seen_batches == 0
    check_all(str(tmp_path), PerfCallback())


def test_the_same_callback_listed_twice_measures_once_and_leaves_no_thread(tmp_path):
    callback = PerfCallback(**CYCLE, **QUIET)
    fit_trainer, _ = seeded_fit(tmp_path, [callback, callback])
    assert fit_trainer.callbacks.count(callback) == 1
    summary = check_all(fit_trainer.log_dir, callback)
    assert summary.timing.steps == TIMED_STEPS and len(summary.traces) == 1


def test_a_resumed_fit_counts_profiler_steps_from_the_checkpoint(tmp_path):
    saver = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=10)
    trainer(tmp_path / "a", [saver], max_steps=10, enable_checkpointing=True).fit(TinyModel(), loader())
    checkpoint = os.path.join(tmp_path, "last.ckpt")
    callback = PerfCallback(skip_first=12, wait=0, warmup=1, active=2, **QUIET)
    resumed = trainer(tmp_path / "b", [callback], max_steps=16)
    resumed.fit(TinyModel(), loader(), ckpt_path=checkpoint)
    summary = check_all(resumed.log_dir, callback)
    assert [t.steps for t in summary.traces] == [[13, 14]]
    path = os.path.join(resumed.log_dir, summary.traces[0].path)
    steps = sorted(e["name"] for e in iter_events(path) if str(e.get("name", "")).startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#13", "ProfilerStep#14"]


class SigtermModel(TinyModel):
    def training_step(self, batch, batch_idx):
        if batch_idx == 4:
            os.kill(os.getpid(), signal.SIGTERM)  # as a cluster scheduler does
        return super().training_step(batch, batch_idx)


def test_sigterm_is_recorded_as_interrupted(tmp_path):
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    callback = PerfCallback(**CYCLE, **QUIET)
    with pytest.raises(SIGTERMException):
        trainer(tmp_path, [callback], limit_train_batches=BATCHES).fit(SigtermModel(), loader())
    summary = check_all(callback.last_summary.log_dir, callback)
    assert summary.status == "interrupted" and summary.timing.steps >= 4


def test_nvml_failing_mid_run_costs_only_the_gpu_figures(tmp_path, monkeypatch, reference_weights):
    nvml = FakeNvml([FakeGpu(uuid="GPU-0", pci=(0, 1, 0), util=[50])])
    real_sampler = utilization.UtilSampler

    def with_fake_gpu(interval_s, cuda_devices, **kwargs):
        return real_sampler(0.01, [0], nvml=nvml, cuda_uuid_lookup=lambda index: "GPU-0", **kwargs)

    monkeypatch.setattr(utilization, "UtilSampler", with_fake_gpu)

    class LosesItsGpu(TinyModel):
        def training_step(self, batch, batch_idx):
            if batch_idx == 3:
                time.sleep(0.05)  # a few readings first
                nvml.read_error = NVMLError_GpuIsLost()
            return super().training_step(batch, batch_idx)

    callback = PerfCallback(**CYCLE, **QUIET)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit_trainer, model = seeded_fit(tmp_path, [callback], model_cls=LosesItsGpu)
    assert fit_trainer.state.finished and nvml.reads > 0
    assert all(a.equal(b) for a, b in zip(model.parameters(), reference_weights, strict=True))
    summary = check_all(fit_trainer.log_dir, callback)
    assert summary.timing.steps == TIMED_STEPS and nvml.init_count == 0  # NVML released


class InterruptedFromAWorker(SleepyDataset):
    """Sends SIGINT (Ctrl-C) to the training process from the first DataLoader worker process that loads a sample,
    once: the interrupt lands while the probe's workers run, however fast the machine is (a timer did not)."""

    def __init__(self, n: int, delay_s: float, main_pid: int, flag: str) -> None:
        super().__init__(n, delay_s=delay_s)
        self.main_pid, self.flag = main_pid, flag

    def __getitem__(self, index: int):
        if os.getpid() != self.main_pid:
            try:
                os.close(os.open(self.flag, os.O_CREAT | os.O_EXCL))
                os.kill(self.main_pid, signal.SIGINT)
            except FileExistsError:
                pass
        return super().__getitem__(index)


def test_ctrl_c_during_the_num_workers_probe_keeps_the_summary_and_ends_the_workers(tmp_path, restore_sigint):
    callback = PerfCallback(**CYCLE, probe_num_workers="always", probe_budget_s=60, log_hparams=False)
    dataset = InterruptedFromAWorker(64, 0.01, os.getpid(), str(tmp_path / "interrupted"))
    data = torch.utils.data.DataLoader(dataset, batch_size=4)
    fit_trainer = trainer(tmp_path, [callback], limit_train_batches=BATCHES)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(SystemExit):
        fit_trainer.fit(TinyModel(), data)
    summary = RunSummary.load(os.path.join(fit_trainer.log_dir, SUMMARY_FILENAME))
    assert summary.status == "finished" and summary.timing.steps == TIMED_STEPS
    assert summary.findings and summary.probes.num_workers is None  # the diagnosis of what was measured
    # children the session had before this fit (multiprocessing's resource tracker, earlier tests' helpers) are
    # not the probe's
    children = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"probe workers left running: {alive}"
    check_all(fit_trainer.log_dir, callback)


def test_the_summary_is_written_before_the_probes_which_say_so_and_update_it(tmp_path, monkeypatch, caplog):
    from lightning_perf.probes import num_workers

    real_probe = num_workers.probe_num_workers
    on_disk_before: list[RunSummary] = []

    def probe_after_the_summary(dataloader, compute, budget_s, loading_waits=False, **more):
        on_disk_before.append(RunSummary.load(os.path.join(fit_trainer.log_dir, SUMMARY_FILENAME)))
        return real_probe(
            dataloader, compute, budget_s=budget_s, max_workers=0, loading_waits=loading_waits, **more
        )

    monkeypatch.setattr(num_workers, "probe_num_workers", probe_after_the_summary)
    callback = PerfCallback(**CYCLE, probe_num_workers="always", probe_budget_s=1, log_hparams=False)
    fit_trainer = trainer(tmp_path, [callback], limit_train_batches=BATCHES)
    with caplog.at_level("INFO"):
        fit_trainer.fit(TinyModel(), loader())
    (before,) = on_disk_before
    assert before.timing.steps == TIMED_STEPS and before.findings and before.probes.num_workers is None
    assert "measuring DataLoader num_workers (up to 1 s" in caplog.text
    after = check_all(fit_trainer.log_dir, callback)
    assert after.probes.num_workers is not None and after.probes.num_workers.candidates
    assert after.timing == before.timing
