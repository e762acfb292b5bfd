"""The probes' typed results (analysis/probe_results.py) read from and written to perf_summary.json in the layout
the releases before them wrote: one object per probe that ran, under its name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_perf.analysis.diagnosis import diagnose
from lightning_perf.analysis.probe_results import CudnnAB, HandOff, NumWorkersProbe, Probes
from lightning_perf.analysis.summary import RunSummary, SummaryError

# Written by a real fit (slow loader, probe_num_workers="always", on CPU) with the release before the probes were
# typed (commit 589d973): its "probes" were free-form dicts.
PREVIOUS = Path(__file__).parent.parent / "data" / "summaries" / "previous_release_perf_summary.json"


def test_a_summary_written_by_the_previous_release_decodes_into_typed_probes_and_writes_back_the_same():
    written = json.loads(PREVIOUS.read_text())
    summary = RunSummary.load(PREVIOUS)
    probes = summary.probes
    assert isinstance(probes.num_workers, NumWorkersProbe) and isinstance(probes.handoff, HandOff)
    assert isinstance(probes.cudnn_benchmark, CudnnAB)
    assert [c["num_workers"] for c in probes.num_workers.candidates] == [
        c["num_workers"] for c in written["probes"]["num_workers"]["candidates"]
    ]
    assert probes.handoff.ms_per_batch == written["probes"]["handoff"]["ms_per_batch"] > 0
    assert probes.cudnn_benchmark.applies is False and "cpu" in probes.cudnn_benchmark.reason
    assert summary.to_dict()["probes"] == written["probes"]  # the layout on disk is unchanged
    assert any(f.id == "input_bound" for f in diagnose(summary))


def test_every_probe_as_the_previous_release_wrote_it_round_trips():
    # the dicts the probes returned before they were typed: the A/B with and without ranks, a hand-off of an
    # older release without touch_ms, a probe of one that wrote no machine_note, loading_waits nor disturbed
    written = {
        "cudnn_benchmark": {
            "applies": True,
            "reason": "median of 5 forward+backward passes on a batch shaped like the training's",
            "off_ms": 12.5,
            "on_ms": 10.0,
            "speedup": 1.25,
            "user_setting": False,
            "ranks": 2,
            "collective_modules": ["SyncBatchNorm"],
        },
        "handoff": {"ms_per_batch": 2.5, "main_ms": 0.9, "batch_bytes": 528, "tensors": 2, "batches": 20},
        "num_workers": {
            "candidates": [{"num_workers": 0, "batches_per_sec": 27.0, "error": None}],
            "compute_batches_per_sec": 40.0,
            "suggested": 2,
            "reason": "measured",
        },
    }
    summary = RunSummary.from_dict({**RunSummary().to_dict(), "probes": written})
    assert summary.probes.cudnn_benchmark == CudnnAB(**written["cudnn_benchmark"])
    assert summary.probes.handoff == HandOff(**written["handoff"]) and summary.probes.handoff.touch_ms is None
    assert summary.probes.num_workers is not None and summary.probes.num_workers.suggested == 2
    assert summary.to_dict()["probes"]["cudnn_benchmark"] == written["cudnn_benchmark"]
    skipped = Probes(cudnn_benchmark=CudnnAB(applies=False, reason="training on cpu"))
    assert skipped.to_dict() == {"cudnn_benchmark": {"applies": False, "reason": "training on cpu"}}
    assert Probes().to_dict() == {}  # a probe that did not run is absent, as before


def test_a_malformed_probe_is_named_in_the_error():
    data = {**RunSummary().to_dict(), "probes": {"handoff": {"ms_per_batch": "fast"}}}
    with pytest.raises(SummaryError, match=r"probes\.handoff\.ms_per_batch: expected a number"):
        RunSummary.from_dict(data)
    unknown = {**RunSummary().to_dict(), "probes": {"a_newer_probe": {"x": 1}}}
    assert RunSummary.from_dict(unknown).probes == Probes()  # a newer release's probe is ignored, not fatal
