"""The slowdown detector on synthetic logging-window series: silent on steady noisy runs (false alarms counted
over many seeds), finding a lasting rise within one window, flat memory over very long runs, and the
``slowdown`` finding built from what it found."""

from __future__ import annotations

import math

import numpy as np

from lightning_perf.analysis.changepoint import MAX_POINTS, Slowdown, SlowdownDetector, WindowPoint
from lightning_perf.analysis.compile_summary import CompileEvent, CompileSummary
from lightning_perf.analysis.diagnosis import diagnose
from lightning_perf.analysis.memory_series import MemorySeries
from lightning_perf.analysis.summary import RunSummary, TimingSummary, TraceFile

WINDOWS = 300  # five minutes of a run at the default >= 1 s windows


def steady(seed: int, bursts: int = 0, n: int = WINDOWS) -> tuple[np.ndarray, int]:
    """Window means (ms) of a steady run and its steps per window (windows of >= 1 s, the default): log-normal
    window noise (6%), a slow random-walk drift, isolated spikes (2% of windows at 1.5-3x: GC, a checkpoint
    flush, a neighbour) and ``bursts`` two-window bursts at 1.2-1.6x (another job's short busy spell)."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(5.0, 200.0)
    drift = np.cumsum(rng.normal(0.0, 0.004, n))
    x = base * np.exp(rng.normal(0.0, 0.06, n) + drift)
    spikes = rng.random(n) < 0.02
    x[spikes] *= rng.uniform(1.5, 3.0, spikes.sum())
    if bursts:
        for start in rng.choice(np.arange(0, n - 12, 20), bursts, replace=False) + rng.integers(0, 10):
            x[start : start + 2] *= rng.uniform(1.2, 1.6)
    return x, max(1, math.ceil(1000.0 / base))


def feed(times: np.ndarray, steps: int, wait_share: float = 0.2) -> SlowdownDetector:
    detector = SlowdownDetector()
    for i, ms in enumerate(times):
        detector.add(WindowPoint((i + 1) * steps, steps, float(ms), wait_share * ms, (1 - wait_share) * ms))
    return detector


def test_steady_noisy_runs_stay_silent_over_100_seeds():
    false_alarms = [seed for seed in range(100) if feed(*steady(seed)).slowdowns]
    assert false_alarms == [], f"false alarms on seeds {false_alarms}"


def test_false_alarm_rate_with_short_bursts_is_at_most_one_percent():
    """Harsher: three two-window bursts a run besides the spikes. Measured: 2 of these 300 runs, 3 of 1000 (0.3%)."""
    runs = 300
    false_alarms = sum(bool(feed(*steady(seed, bursts=3)).slowdowns) for seed in range(runs))
    assert false_alarms / runs <= 0.01, f"{false_alarms} false alarms in {runs} runs"


def test_a_lasting_rise_is_found_within_one_window():
    hits, ratios = 0, []
    for seed in range(100):
        times, steps = steady(seed)
        change = int(np.random.default_rng(seed + 1000).integers(30, 250))
        times[change:] *= 1.5
        found = feed(times, steps).slowdowns
        close = [s for s in found if abs(s.step - change * steps) <= steps]
        hits += bool(close)
        ratios += [s.ratio for s in close]
    assert hits >= 95, f"found {hits} of 100 lasting 1.5x rises within one window"
    assert abs(float(np.median(ratios)) - 1.5) < 0.05


def test_a_slowdown_splits_into_wait_and_compute_and_a_second_one_is_found_too():
    times, steps = steady(7)
    times = times[:200]
    times[80:] *= 1.6
    times[150:] *= 1.4
    detector = SlowdownDetector()
    for i, ms in enumerate(times):
        slow_wait = 0.6 * times[i] if i >= 80 else 0.0  # the first rise is all DataLoader wait
        detector.add(WindowPoint((i + 1) * steps, steps, float(ms), float(slow_wait), float(ms - slow_wait)))
    first, second = detector.slowdowns
    assert abs(first.step - 80 * steps) <= steps and abs(second.step - 150 * steps) <= steps
    assert first.low <= first.ratio <= first.high and first.low > 1.25
    assert first.after_wait_ms - first.before_wait_ms > first.after_compute_ms - first.before_compute_ms


def test_memory_stays_flat_over_a_very_long_run():
    times, steps = steady(3, n=3 * MAX_POINTS)
    times[-100:] *= 2.0
    detector = feed(times, steps)
    assert len(detector.points) <= MAX_POINTS
    assert [round(s.ratio, 0) for s in detector.slowdowns] == [2.0]
    # the location keeps the resolution of the merged windows (two original windows each)
    assert abs(detector.slowdowns[0].step - (3 * MAX_POINTS - 100) * steps) <= 2 * steps


def _summary(found: Slowdown, **kw) -> RunSummary:
    return RunSummary(timing=TimingSummary(steps=20000), slowdowns=[found], log_dir="runs/a", **kw)


def test_the_finding_names_the_input_pipeline_and_the_extra_trace():
    found = Slowdown(
        12000, 120.0, 190.0, 1.58, 1.5, 1.66, 1e-4, 60, 10, 12400, 10.0, 75.0, 110.0, 115.0, 12401
    )
    traces = [
        TraceFile("h_rank0.1.pt.trace.json.gz", [6, 7, 8]),
        TraceFile("h_rank0_slowdown.2.pt.trace.json.gz", [12402, 12403, 12404]),
    ]
    (finding,) = [f for f in diagnose(_summary(found, traces=traces)) if f.id == "slowdown"]
    assert finding.severity == "high"
    assert (
        "From step 12,000 the mean step rose 120.0 -> 190.0 ms (1.58x, 95% interval 1.50-1.66x"
        in finding.evidence
    )
    assert "DataLoader wait +65.0 ms, compute +5.0 ms: the input pipeline slowed" in finding.evidence
    assert "h_rank0_slowdown.2.pt.trace.json.gz, batches 12402-12404" in finding.recommendation


def test_the_finding_names_memory_growing_across_the_change():
    found = Slowdown(500, 10.0, 14.0, 1.4, 1.3, 1.5, 1e-3, 20, 8, 600, 1.0, 1.2, 9.0, 12.8)
    memory = MemorySeries(
        steps=list(range(0, 1000, 50)),
        process_rss_mb=[1000.0 if s < 500 else 1400.0 for s in range(0, 1000, 50)],
    )
    (finding,) = [f for f in diagnose(_summary(found, memory=memory)) if f.id == "slowdown"]
    assert finding.severity == "medium"
    assert "the training step itself slowed" in finding.evidence
    assert "process RSS grew 1000 -> 1400 MB across step 500" in finding.evidence
    assert "lightning-perf capture" in finding.recommendation


def test_the_summary_round_trips_its_slowdowns(tmp_path):
    found = Slowdown(500, 10.0, 14.0, 1.4, 1.3, 1.5, 1e-3, 20, 8, 600)
    _summary(found).save(tmp_path / "perf_summary.json")
    assert RunSummary.load(tmp_path).slowdowns == [found]


def test_the_finding_names_a_recompile_at_the_change():
    found = Slowdown(400, 10.0, 16.0, 1.6, 1.5, 1.7, 1e-4, 40, 6, 460, 1.0, 1.0, 9.0, 15.0)
    compiled = CompileSummary(
        compiles=3,
        recompiles=2,
        events=[
            CompileEvent("0/0", 0, "train", 2.0),
            CompileEvent("0/1", 396, "train", 1.5, recompile_reason="tensor 'x' size mismatch at index 0"),
            CompileEvent("0/2", 2000, "train", 1.5, recompile_reason="late, not at the change"),
        ],
    )
    (finding,) = [f for f in diagnose(_summary(found, compile=compiled)) if f.id == "slowdown"]
    assert "torch.compile recompiled at step 396 (tensor 'x' size mismatch at index 0)" in finding.evidence
    assert "late, not at the change" not in finding.evidence
