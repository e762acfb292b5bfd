"""Runs too short for a verdict (issue 25, point 3): no grade from a handful of steps, and memory that rose in
too few readings to fit is reported as too short to judge, with the readings."""

from __future__ import annotations

import pytest

from lightning_perf.analysis.diagnosis import diagnose
from lightning_perf.analysis.findings_render import render_console
from lightning_perf.analysis.memory_series import MemorySeries
from lightning_perf.analysis.probe_results import NumWorkersProbe, Probes
from lightning_perf.analysis.rules.thresholds import MEMORY_MIN_POINTS, MIN_STEPS_FOR_VERDICT, VERDICTS
from lightning_perf.analysis.summary import Distribution, RunSummary, Settings, TimingSummary


def dist(median: float) -> Distribution:
    return Distribution(count=1, mean=median, median=median, p90=median, min=median, max=median)


def timed(steps: int, wait_pct: float = 40.6, **summary_fields) -> RunSummary:
    return RunSummary(
        status="failed",
        timing=TimingSummary(
            steps=steps, data_wait_pct=wait_pct, step_time_ms=dist(20.0), data_wait_ms=dist(8.1)
        ),
        settings=Settings(num_workers=0, cpu_count=8, accelerator="cpu"),
        **summary_fields,
    )


def input_finding(summary: RunSummary):
    (finding,) = [f for f in diagnose(summary) if f.id == "input_bound"]
    return finding


@pytest.mark.parametrize("wait_pct", [40.6, 10.0, 1.0])  # every grade: highly, moderately, not
def test_one_timed_step_gets_no_grade_but_too_short_with_what_was_measured(wait_pct):
    finding = input_finding(timed(1, wait_pct))
    assert finding.title == "Too short for an input-bound verdict" and finding.severity == "info"
    assert not any(v in finding.title + finding.evidence for v in VERDICTS)
    assert (
        f"Only 1 step was timed, fewer than the {MIN_STEPS_FOR_VERDICT} a verdict needs" in finding.evidence
    )
    assert f"DataLoader wait is {wait_pct:.1f}% of step time" in finding.evidence
    assert finding.settings_change == {}


def test_no_other_rule_leans_on_a_grade_from_a_short_run():
    findings = diagnose(timed(3, 60.0))
    assert not any(v in f.title + f.evidence for f in findings for v in VERDICTS)
    assert all(not f.settings_change for f in findings)
    # a run of enough steps with the same figures is highly input-bound and asks for workers
    assert any(f.settings_change for f in diagnose(timed(100, 60.0)))


def test_the_console_line_says_too_short_not_highly_input_bound():
    line = render_console(diagnose(timed(1))).splitlines()[0]
    assert line.startswith("lightning-perf: Too short for an input-bound verdict - Only 1 step was timed")
    assert "highly" not in line


def test_at_the_minimum_the_run_is_graded():
    finding = input_finding(timed(MIN_STEPS_FOR_VERDICT, 40.6))
    assert "highly input-bound" in finding.title  # still hedged as a short run, but graded
    assert input_finding(timed(100, 40.6)).title == "Training is highly input-bound"


def test_a_measured_num_workers_probe_keeps_its_verdict_in_a_short_run():
    probe = NumWorkersProbe(suggested=2, reason="measured")
    finding = input_finding(timed(3, 40.6, probes=Probes(num_workers=probe)))
    assert finding.title == "Training is highly input-bound"


def test_memory_that_grew_in_four_readings_is_too_short_to_judge_with_the_readings():
    series = MemorySeries(steps=[1, 2, 3, 4], process_rss_mb=[1000.0, 1150.0, 1280.0, 1400.0])
    (found,) = [f for f in diagnose(timed(4, memory=series)) if f.id == "memory_growth"]
    assert found.title == "Too short to judge memory growth" and found.severity == "info"
    assert (
        "Process RSS rose 400 MB over steps 1-4 in 4 readings (1 GB, 1.15 GB, 1.28 GB, 1.4 GB)"
        in found.evidence
    )
    assert f"at least {MEMORY_MIN_POINTS} readings" in found.evidence


def test_short_memory_series_that_did_not_rise_past_the_line_stay_silent():
    flat = MemorySeries(steps=[1, 2, 3, 4], process_rss_mb=[1000.0, 1010.0, 1005.0, 1020.0])
    assert not [f for f in diagnose(timed(4, memory=flat)) if f.id == "memory_growth"]
    one = MemorySeries(steps=[1], process_rss_mb=[1000.0])
    assert not [f for f in diagnose(timed(1, memory=one)) if f.id == "memory_growth"]
