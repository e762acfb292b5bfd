"""memory_growth from the sampler's series: synthetic series at and around each line, the severity grades, the
GPU capacity advice shared with the trace rule, one finding when the trace rule also speaks, the JSON form."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from lightning_perf.analysis.diagnosis import diagnose
from lightning_perf.analysis.memory_series import Growth, MemorySeries, fit_growth
from lightning_perf.analysis.rules import thresholds as t
from lightning_perf.analysis.rules.memory import capacity_finding, memory_growth
from lightning_perf.analysis.rules.trace_thresholds import MEMORY_NEAR_CAPACITY_PCT, MEMORY_ROOM_PCT
from lightning_perf.analysis.summary import RunSummary, SummaryError
from lightning_perf.analysis.trace_figures import TraceFigures
from lightning_perf.output.trace_findings import with_trace_findings

STEPS = list(range(101))  # the fit sees steps 20..100 after the warm-up fifth: a span of 80 steps
SPAN = 80


def rss(values, steps=STEPS, **fields) -> RunSummary:
    return RunSummary(memory=MemorySeries(steps=list(steps), process_rss_mb=list(values), **fields))


def gpu(values, steps=STEPS, **fields) -> RunSummary:
    fields.setdefault("gpu_total_gb", 80.0)
    return RunSummary(memory=MemorySeries(steps=list(steps), gpu_allocated_mb=list(values), **fields))


def finding(summary: RunSummary):
    return memory_growth(summary, None)


def linear(mb_per_step: float, base: float = 1000.0, noise: float = 0.0, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [base + mb_per_step * s + rng.gauss(0.0, noise) for s in STEPS]


def test_flat_and_noisy_flat_series_are_silent():
    assert finding(rss([1000.0] * len(STEPS))) is None
    for seed in range(30):  # RSS jitter of a real process: +-20 MB
        assert finding(rss(linear(0.0, noise=20.0, seed=seed))) is None, seed


def test_steady_growth_is_found_with_its_rate_interval_span_and_when_ram_runs_out():
    found = finding(rss(linear(4.0, noise=10.0), ram_available_gb=100.0, ram_total_gb=128.0))
    assert found.id == "memory_growth" and found.title == "Host memory grows step after step"
    rate = float(found.evidence.split("rises ")[1].split(" MB")[0])
    low, high = (float(x) for x in found.evidence.split("interval ")[1].split(")")[0].split("-"))
    assert low <= 4.0 <= high and abs(rate - 4.0) < 0.3
    assert "over steps 20-100" in found.evidence and "81 readings after warm-up" in found.evidence
    assert "the 100.0 GB of RAM free at the end is used up in ~25" in found.evidence  # 100 GB / 4 MB
    assert "loss.detach()" in found.recommendation and "torchmetrics" in found.recommendation
    assert found.settings_change == {}


def test_total_growth_lines_for_rss_and_gpu():
    assert finding(rss(linear((t.RSS_GROWTH_MIN_MB + 4) / SPAN))) is not None
    assert finding(rss(linear((t.RSS_GROWTH_MIN_MB - 4) / SPAN))) is None  # the heap's own slack
    assert finding(gpu(linear((t.GPU_GROWTH_MIN_MB + 2) / SPAN))) is not None
    assert finding(gpu(linear((t.GPU_GROWTH_MIN_MB - 2) / SPAN))) is None


def test_a_warm_up_jump_then_flat_is_no_leak_but_stairs_all_run_long_are():
    early = [1000.0 if s < 10 else 1500.0 for s in STEPS]  # allocator, optimizer state, workers
    late = [1000.0 if s < 40 else 1500.0 for s in STEPS]  # after the warm-up share, then a plateau
    assert finding(rss(early)) is None and finding(rss(late)) is None
    stairs = [1000.0 + 40.0 * (s // 10) for s in STEPS]  # the allocator's segments: a leak in steps
    assert finding(rss(stairs)) is not None


def test_too_few_readings_or_steps_give_no_fit():
    # 12 readings at steps 0..11 keep 9 after the warm-up fifth: one short of the line; 13 keep 10
    assert fit_growth(range(12), [100.0 * s for s in range(12)]) is None
    assert fit_growth(range(13), [100.0 * s for s in range(13)]) is not None
    assert fit_growth([5] * 40, [100.0 * s for s in range(40)]) is None  # one step: no slope to fit
    assert fit_growth(range(40), [None] * 40) is None
    assert finding(RunSummary()) is None and finding(rss([], steps=[])) is None


def test_readings_that_failed_are_left_out_not_read_as_zero():
    values = linear(4.0)
    values[50:60] = [None] * 10
    growth = fit_growth(STEPS, values)
    assert growth.points == SPAN + 1 - 10 and abs(growth.mb_per_step - 4.0) < 1e-6


def growth(**fields) -> Growth:
    base = dict(
        mb_per_step=2.0,
        low=1.0,
        high=3.0,
        first_step=20,
        last_step=100,
        points=81,
        tau=t.MEMORY_MIN_TAU,
        late_mb_per_step=2.0 * t.MEMORY_LATE_SLOPE_SHARE,
        start_mb=1000.0,
        end_mb=1160.0,
        last_mb=1160.0,
    )
    return Growth(**{**base, **fields})


def test_significance_lines_interval_above_zero_monotone_still_climbing():
    assert growth().significant
    assert not growth(low=0.0).significant  # the interval reaches "no growth"
    assert not growth(tau=t.MEMORY_MIN_TAU - 0.01).significant  # up and down, not a climb
    assert not growth(late_mb_per_step=2.0 * t.MEMORY_LATE_SLOPE_SHARE - 0.01).significant  # levelled off


def test_severity_high_when_memory_runs_out_within_ten_runs_medium_from_1_mb_a_step_else_low():
    # 4 MB a step for 100 steps, 1 GB free: out in 250 steps, within 10x the run
    assert finding(rss(linear(4.0), ram_available_gb=1.0)).severity == "high"
    assert finding(rss(linear(4.0), ram_available_gb=4.0)).severity == "high"  # 1000 steps: at the line
    assert finding(rss(linear(4.0), ram_available_gb=4.1)).severity == "medium"
    assert finding(rss(linear(4.0))).severity == "medium"  # capacity unknown: graded by rate
    assert finding(rss(linear(0.9), ram_available_gb=100.0)).severity == "low"  # 72 MB over the run


def test_gpu_growth_counts_from_the_peak_and_both_kinds_share_one_finding():
    leak = linear(10.0, base=2000.0)
    found = finding(gpu(leak, gpu_peak_allocated_gb=8.0))
    assert found.title == "GPU memory grows step after step"
    assert "the 72.0 GB left of the 80.0 GB device is used up in ~7200 steps" in found.evidence
    both = RunSummary(
        memory=MemorySeries(steps=STEPS, process_rss_mb=linear(4.0), gpu_allocated_mb=leak, gpu_total_gb=80.0)
    )
    found = finding(both)
    assert found.title == "GPU memory and host memory grow step after step"
    assert found.evidence.startswith("GPU memory (allocated) rises") and "Process RSS rises" in found.evidence


def test_gpu_peak_against_capacity_from_the_sampler_without_growth():
    flat = [3000.0] * len(STEPS)
    near = finding(gpu(flat, gpu_peak_allocated_gb=80.0 * MEMORY_NEAR_CAPACITY_PCT / 100))
    assert near.severity == "medium" and "headroom" in near.recommendation.lower()
    assert near.evidence == "Peak allocated 72.0 GB, 90.0% of 80.0 GB over the run."
    room = finding(gpu(flat, gpu_peak_allocated_gb=80.0 * MEMORY_ROOM_PCT / 100 - 0.1))
    assert room.severity == "info" and "larger batch" in room.recommendation
    assert finding(gpu(flat, gpu_peak_allocated_gb=60.0)) is None  # between the lines
    assert finding(rss(flat)) is None  # no GPU: no GPU advice
    # a trace with the allocator's own events gives the peak: the sampler does not repeat it
    traced = gpu(flat, gpu_peak_allocated_gb=30.0)
    traced.trace_figures = [TraceFigures(memory_peak_gb=30.0, memory_absolute=True, memory_capacity_gb=80.0)]
    assert finding(traced) is None


def test_the_capacity_advice_is_one_helper_for_trace_and_sampler():
    assert capacity_finding(None, 80.0) is None and capacity_finding(10.0, None) is None
    assert capacity_finding(10.0, 80.0).evidence == "Peak allocated 10.0 GB, 12.5% of 80.0 GB."


def test_the_diagnosis_shows_one_memory_growth_when_the_trace_also_finds_it():
    summary = gpu(linear(10.0, base=2000.0), gpu_peak_allocated_gb=8.0)
    summary.trace_figures = [
        TraceFigures(
            steps=5,
            memory_growth_mb_per_step=10.0,
            memory_growth_steps=4,
            memory_peak_gb=8.0,
            memory_capacity_gb=80.0,
            memory_absolute=True,
        )
    ]
    summary.findings = diagnose(summary)
    assert [f.id for f in summary.findings].count("memory_growth") == 1
    merged = [f for f in with_trace_findings(summary) if f.id == "memory_growth"]
    assert len(merged) == 1
    assert merged[0].evidence.startswith("Allocated memory rises")  # the trace's allocator events win


def test_the_series_round_trips_through_json_and_negative_memory_is_refused(tmp_path):
    series = MemorySeries(
        steps=[0, 1, 2], process_rss_mb=[900.5, None, 901.0], gpu_unavailable_reason="no GPU in use"
    )
    path = tmp_path / "perf_summary.json"
    RunSummary(memory=series).save(path)
    assert RunSummary.load(path).memory == series
    data = json.loads(path.read_text())
    assert data["memory"]["gpu_allocated_mb"] == [] and data["memory"]["process_rss_mb"][1] is None
    data["memory"]["process_rss_mb"][0] = -1.0
    path.write_text(json.dumps(data))
    with pytest.raises(SummaryError, match=r"memory\.process_rss_mb\[0\]"):
        RunSummary.load(path)
    assert dataclasses.asdict(RunSummary()).get("memory") is None  # absent without a sampler
