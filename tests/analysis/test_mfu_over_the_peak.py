"""An MFU above 100% is never a figure (issue 54): no step outruns its device, so the measured peak (or the step's
FLOP count) is wrong; the summary, the end-of-fit line and the diagnosis say why instead."""

from __future__ import annotations

from lightning_perf.analysis.compute.limit import DevicePeak, StepFlops, compute_limit, mfu_line
from lightning_perf.analysis.diagnosis import diagnose
from lightning_perf.analysis.findings_render import render_answer, render_markdown
from tests.analysis.test_diagnosis import make


def peak(busy: bool, **datasheet) -> DevicePeak:
    return DevicePeak(
        device="cpu",
        device_name="a CPU",
        dtype="fp32",
        measured_flops_per_s=20e9,
        measured_size=1024,
        others_cores=1.3 if busy else 0.0,
        cpu_count=2,
        busy=busy,
        **datasheet,
    )


def test_a_step_faster_than_a_busy_peak_has_no_mfu_and_says_the_peak_was_taken_beside_others():
    # 1 GFLOP in a 25 ms step: 40 GFLOP/s, twice the 20 GFLOP/s the peak got beside two CPU hogs
    limit = compute_limit(StepFlops(flops=1e9), peak(busy=True), 25.0)
    assert limit.achieved_flops_per_s == 40e9
    assert limit.mfu_pct is None
    assert limit.mfu_not_computed == (
        "the measured peak 20 GFLOP/s was taken while other processes held the cores (they used 1.3 of 2 "
        "cores); MFU not computed"
    )
    line = mfu_line(limit)
    assert line == f"1 GFLOP a step at 40 GFLOP/s ({limit.mfu_not_computed})"
    assert "%" not in line


def test_a_step_faster_than_a_quiet_peak_names_the_peak_or_the_count_as_wrong():
    limit = compute_limit(StepFlops(flops=1e9, source="user"), peak(busy=False), 25.0)
    assert limit.mfu_pct is None
    assert limit.mfu_not_computed == (
        "the step's 40 GFLOP/s exceed the measured peak 20 GFLOP/s fp32 matmul: the peak, or flops_per_batch, "
        "is wrong; MFU not computed"
    )


def test_the_reports_show_the_reason_and_no_mfu_figure_and_low_mfu_stays_silent():
    summary = make(1.0, step_ms=25.0)
    summary.compute_limit = compute_limit(StepFlops(flops=1e9), peak(busy=True), 25.0)
    findings = diagnose(summary)
    assert "low_mfu" not in [f.id for f in findings]
    for text in (render_answer(findings, summary), render_markdown(findings, summary)):
        assert "taken while other processes held the cores" in text and "MFU not computed" in text
        assert "% of this CPU's measured" not in text


def test_a_figure_up_to_100_percent_stays_and_says_when_the_peak_was_busy():
    limit = compute_limit(StepFlops(flops=1e9), peak(busy=True), 100.0)  # 10 of 20 GFLOP/s
    assert limit.mfu_pct == 50.0 and limit.mfu_not_computed is None
    assert mfu_line(limit) == (
        "1 GFLOP a step at 10 GFLOP/s: 50% of this CPU's measured 20 GFLOP/s fp32 matmul (measured while other "
        "processes held the cores: they used 1.3 of 2 cores)"
    )
    quiet = compute_limit(StepFlops(flops=1e9), peak(busy=False), 100.0)
    assert (
        mfu_line(quiet) == "1 GFLOP a step at 10 GFLOP/s: 50% of this CPU's measured 20 GFLOP/s fp32 matmul"
    )


def test_a_step_above_the_datasheets_peak_has_no_datasheet_figure():
    sheet = {"datasheet_flops_per_s": 30e9, "datasheet_device": "a GPU"}
    over = compute_limit(StepFlops(flops=1e9), peak(busy=False, **sheet), 25.0)  # 40 of 30 GFLOP/s
    assert over.datasheet_mfu_pct is None and "datasheet" not in mfu_line(over)
    under = compute_limit(StepFlops(flops=1e9), peak(busy=False, **sheet), 50.0)  # 20 of 30
    assert round(under.datasheet_mfu_pct) == 67 and under.mfu_pct == 100.0
