"""A peak measured while other processes held the cores is not the machine's peak (issue 54): it is cached marked
busy, measured again for a run that had the machine to itself, and an MFU above 100% against it is no figure."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_perf import PerfCallback
from lightning_perf.analysis import metrics
from lightning_perf.analysis.rules.thresholds import NOISY_OTHER_CPU_SHARE
from lightning_perf.analysis.summary import MachineState, RunSummary
from lightning_perf.probes import device_peak
from tests.helpers import TinyModel, loader, trainer

CPU = torch.device("cpu")


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(device_peak, "_MEMO", {})  # measured in this test, not by an earlier one
    return tmp_path / "cache" / "lightning-perf" / "peaks.json"


@pytest.fixture
def measurements(monkeypatch):
    """The peak's measurements in this test (each still a real timed matmul)."""
    calls = []
    measure = device_peak.measure

    def counted(*args, **kwargs):
        calls.append(args)
        return measure(*args, **kwargs)

    monkeypatch.setattr(device_peak, "measure", counted)
    return calls


def cached_entry(path):
    (entry,) = json.loads(path.read_text()).values()
    return entry


def test_a_peak_measured_beside_two_cpu_hogs_is_cached_busy_and_measured_again_for_a_quiet_run(
    fresh_cache, measurements, cpu_hogs
):
    first = device_peak.peak(CPU, "fp32")
    assert first.busy and not first.cached, first
    # the two hogs' share of the cores, read over the timed matmuls (they take a core each where they can)
    assert first.others_cores >= NOISY_OTHER_CPU_SHARE * first.cpu_count
    entry = cached_entry(fresh_cache)
    assert entry["busy"] is True and entry["measured_flops_per_s"] == first.measured_flops_per_s
    # a busy run takes the busy figure as it is: beside others' work both pay alike
    assert device_peak.peak(CPU, "fp32").cached and len(measurements) == 1
    device_peak._MEMO.clear()
    assert device_peak.peak(CPU, "fp32").busy and len(measurements) == 1  # from the file, marked
    # a run that had the machine to itself measures again: the hogs still run, so busy again, and the faster of
    # the two busy figures is kept
    again = device_peak.peak(CPU, "fp32", quiet_run=True)
    assert len(measurements) == 2 and again.busy
    assert again.measured_flops_per_s >= first.measured_flops_per_s
    assert cached_entry(fresh_cache)["measured_flops_per_s"] == again.measured_flops_per_s


class QuietWatch:
    """The machine as a quiet one reads: nobody else on the cores while the matmuls are timed."""

    def finish(self) -> MachineState:
        return MachineState(cpu_count=2, other_cores=0.0)


def test_a_quiet_measurement_replaces_a_busy_one(fresh_cache, measurements, monkeypatch, cpu_hogs):
    busy = device_peak.peak(CPU, "fp32")
    assert busy.busy
    monkeypatch.setattr(device_peak, "MachineWatch", QuietWatch)  # the hogs' load, read as a quiet machine
    quiet = device_peak.peak(CPU, "fp32", quiet_run=True)
    assert not quiet.busy and not quiet.cached and len(measurements) == 2
    assert cached_entry(fresh_cache)["busy"] is False
    device_peak._MEMO.clear()
    # the quiet figure is the machine's: a later quiet run takes it from the file
    assert device_peak.peak(CPU, "fp32", quiet_run=True).cached and len(measurements) == 2


def test_a_fit_whose_rate_exceeds_a_busy_peak_shows_no_mfu_and_says_why(
    tmp_path, caplog, fresh_cache, cpu_hogs
):
    # the user's flops_per_batch far above what this CPU can do a step (10 TFLOP): the step's rate exceeds any
    # peak measured here, and the peak, measured beside the hogs, is marked busy
    callback = PerfCallback(probe_num_workers="never", enable_profiler=False, flops_per_batch=1e13)
    with caplog.at_level(logging.INFO, logger="lightning_perf"):
        trainer(tmp_path, [callback]).fit(TinyModel(), loader(n=64, batch_size=4))
    text = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("lightning_perf"))
    limit = RunSummary.load(callback.last_summary.log_dir).compute_limit
    assert limit.peak.busy and limit.mfu_pct is None
    assert limit.mfu_not_computed.startswith("the measured peak ")
    assert limit.mfu_not_computed.endswith(
        "was taken while other processes held the cores "
        f"(they used {limit.peak.others_cores:.1f} of {limit.peak.cpu_count} cores); MFU not computed"
    )
    assert limit.mfu_not_computed in text and "% of this CPU's measured" not in text
    # nor a figure a step in TensorBoard
    events = EventAccumulator(str(tmp_path / "lightning_logs" / "version_0"))
    events.Reload()
    assert metrics.MFU.tag not in events.Tags()["scalars"]
    assert events.Tags()["scalars"]  # the run's other series were written


def test_an_unmarked_entry_of_an_earlier_version_is_measured_again_by_a_quiet_run(fresh_cache, measurements):
    """Entries written before the busy mark may have been timed beside others' work (16.8 GFLOP/s cached where
    the machine does 150: a CNN's 7% MFU read 67%, and low_mfu stayed silent in CI)."""
    key = device_peak.peak(CPU, "fp32", quiet_run=True)  # fills the cache with this machine's key
    assert len(measurements) == 1
    path_entries = json.loads(fresh_cache.read_text())
    (name,) = path_entries
    old = {k: v for k, v in path_entries[name].items() if k not in ("busy", "others_cores", "cpu_count")}
    old["measured_flops_per_s"] = key.measured_flops_per_s / 9  # as a busy machine once timed it
    fresh_cache.write_text(json.dumps({name: old}))
    device_peak._MEMO.clear()
    assert device_peak.peak(CPU, "fp32").busy  # not known to be quiet: a busy run keeps it, marked
    device_peak._MEMO.clear()
    again = device_peak.peak(CPU, "fp32", quiet_run=True)
    assert len(measurements) == 2 and not again.cached  # a quiet run measured it again
    assert again.measured_flops_per_s > old["measured_flops_per_s"] or again.busy
