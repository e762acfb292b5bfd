"""The GPU side of the diagnosis on real GPU traces recorded by other people (tests/data/realtraces; its README
lists what torch-tb-profiler 0.4.3 and HolisticTraceAnalysis 0.5.0 say about each)."""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

import pytest

from lightning_perf.analysis.rules.trace import diagnose_trace
from lightning_perf.analysis.summary import SUMMARY_FILENAME, RunSummary
from lightning_perf.traces.figures.gpu_figures import trace_figures
from lightning_perf.traces.read.loader import load_trace
from lightning_perf.traces.read.reader import rewrite_trace
from lightning_perf.traces.report.build import build_report, find_traces


@functools.cache
def _figures(path: str):
    return trace_figures(load_trace(path))


def figures_of(realtraces: Path, folder: str):
    (path,) = find_traces(str(realtraces / folder))
    return _figures(path)


def findings_of(realtraces: Path, folder: str) -> dict:
    return {f.id: f for f in diagnose_trace(figures_of(realtraces, folder))}


# torch-tb-profiler's Overview (README table): step ms and the shares that match it exactly
TB_OVERVIEW = {
    "resnet50_v100_workers0": (177.592, {"dataloader": 33.4, "kernel": 55.5, "memcpy": 1.1, "cpu_exec": 7.7}),
    "resnet50_v100_workers4": (141.068, {"dataloader": 0.8, "kernel": 70.3, "memcpy": 2.2, "cpu_exec": 16.1}),
}


@pytest.mark.parametrize("folder", sorted(TB_OVERVIEW))
def test_breakdown_equals_torch_tb_profiler(realtraces, folder):
    step_ms, shares = TB_OVERVIEW[folder]
    figures = figures_of(realtraces, folder)
    assert figures.step_ms == pytest.approx(step_ms, abs=0.001)
    for category, pct in shares.items():
        assert figures.breakdown_pct[category] == pytest.approx(pct, abs=0.05), category


def test_rank1_breakdown_equals_torch_tb_profiler_with_nccl_moved_to_communication(realtraces):
    figures = figures_of(realtraces, "ddp_a100_rank1_of2")
    assert figures.step_ms == pytest.approx(124.067, abs=0.05)
    # the plugin's Kernel (83.4%) counts NCCL kernels as Kernel; we move them to Communication, which ranks
    # below Memcpy (the plugin's ProfileRole order), so NCCL time under a copy becomes Memcpy: the three
    # together are the plugin's Kernel + Memcpy (83.4% + 12.9%)
    pct = figures.breakdown_pct
    assert pct["kernel"] + pct["communication"] + pct["memcpy"] == pytest.approx(83.4 + 12.9, abs=0.3)
    assert pct["kernel"] + pct["communication"] == pytest.approx(83.4, abs=1.5)
    assert pct["communication"] > 5


def test_rank0_steps_are_aligned_to_the_gpu_work_they_launched(realtraces):
    """The README: the plugin averages CPU-side step spans (78.8 ms, the CPU runs ahead in the first two steps);
    aligned to the GPU work each step launched, a step is ~96 ms, as in steady state."""
    figures = figures_of(realtraces, "ddp_a100_rank0")
    assert figures.step_ms == pytest.approx(96, abs=1.5)
    assert figures.breakdown_pct["kernel"] == pytest.approx(96.5, abs=1.0)


# HolisticTraceAnalysis 0.5.0's get_temporal_breakdown: the README table for the DDP traces; the resnet ones
# measured by benchmarks/bench_report_tools.py (HTA in its own venv) on 2026-12-03
HTA = {
    "ddp_a100_rank0": (2.63, 96.75, 0.62),
    "ddp_a100_rank1_of2": (7.47, 68.31, 24.23),
    "resnet50_v100_workers0": (39.43, 59.35, 1.22),
    "resnet50_v100_workers4": (24.32, 73.23, 2.45),
}


@pytest.mark.parametrize("folder", sorted(HTA))
def test_gpu_timeline_within_one_point_of_hta(realtraces, folder):
    idle, compute, non_compute = HTA[folder]
    figures = figures_of(realtraces, folder)
    assert figures.idle_pct == pytest.approx(idle, abs=1.0)
    assert figures.compute_pct == pytest.approx(compute, abs=1.0)
    assert figures.non_compute_pct == pytest.approx(non_compute, abs=1.0)
    assert figures.idle_pct + figures.compute_pct + figures.non_compute_pct == pytest.approx(100.0)


def test_workers0_is_highly_input_bound_and_misses_tensor_cores(realtraces):
    findings = findings_of(realtraces, "resnet50_v100_workers0")
    assert findings["input_bound"].severity == "high"
    assert "33.4%" in findings["input_bound"].evidence
    assert findings["mixed_precision"].settings_change == {"precision": "16-mixed"}  # V100: no bf16
    assert "gpu_idle" not in findings  # the GPU idles because of the input: one cause, one finding
    assert findings["pageable_memcpy"].settings_change == {"pin_memory": True}


def test_workers4_gives_mixed_precision_and_no_input_finding(realtraces):
    findings = findings_of(realtraces, "resnet50_v100_workers4")
    assert "input_bound" not in findings
    assert findings["mixed_precision"].severity == "medium"
    # torch-tb-profiler: "Kernels with 68% time are launched by Tensor Cores eligible operators"
    assert figures_of(realtraces, "resnet50_v100_workers4").tc_eligible_without_tc_pct == pytest.approx(
        68, abs=1
    )
    assert "68" in findings["mixed_precision"].evidence or "67.8" in findings["mixed_precision"].evidence


def test_rank1_names_cudamemcpyasync_as_the_largest_wait_and_shows_communication(realtraces):
    figures = figures_of(realtraces, "ddp_a100_rank1_of2")
    top = figures.blocking[0]
    assert top.name == "cudaMemcpyAsync"
    assert top.operator == "aten::item > aten::_local_scalar_dense"
    # README: 369.5 ms of 744.6 ms in cudaMemcpyAsync; the blocking ones (long waits) are most of it
    assert 250 < sum(b.ms_per_step for b in figures.blocking if b.name == "cudaMemcpyAsync") * 6 < 369.6
    # README: NCCL kernels run 251 ms over the 6 steps
    assert figures.communication_ms_per_step * figures.steps == pytest.approx(251, rel=0.02)
    assert 0 < figures.exposed_communication_ms_per_step < figures.communication_ms_per_step
    # issue 19 item 10: kernel-busy 83.4% counting NCCL, 73.5% compute only
    assert figures.kernel_busy_pct == pytest.approx(83.4, abs=0.1)
    assert figures.compute_busy_pct == pytest.approx(73.5, abs=0.2)
    kinds = {m.kind: m for m in figures.memcpy}
    assert kinds["HtoD (Pinned -> Device)"].ms_per_step * 6 == pytest.approx(66.6, rel=0.01)
    assert figures.pageable_htod_calls == 0 and figures.tensor_core_pct == 0.0
    assert findings_of(realtraces, "ddp_a100_rank1_of2")["host_sync"].title.endswith("cudaMemcpyAsync")


def test_rank0_gives_no_high_severity_finding(realtraces):
    findings = findings_of(realtraces, "ddp_a100_rank0")
    assert [f.id for f in findings.values() if f.severity == "high"] == []
    assert "host_sync" not in findings  # long copies while the GPU is 97% busy are back-pressure, not stalls


def test_every_folder_is_found_by_content_whatever_the_name(realtraces, tmp_path):
    for folder in (
        "ddp_a100_rank0",
        "ddp_a100_rank1_of2",
        "resnet50_v100_workers0",
        "resnet50_v100_workers4",
    ):
        assert len(find_traces(str(realtraces / folder))) == 1
    # other JSON beside a trace is skipped silently; a run dir's summary is read, not taken for a trace
    shutil.copy(realtraces / "ddp_a100_rank1_of2" / "test.json.gz", tmp_path)
    RunSummary(run_name="r").save(tmp_path / SUMMARY_FILENAME)
    (tmp_path / "hparams.json").write_text('{"lr": 0.1}')
    (tmp_path / "broken.json").write_text("{")
    assert [os.path.basename(p) for p in find_traces(str(tmp_path))] == ["test.json.gz"]
    report = build_report(str(tmp_path))
    assert len(report["traces"]) == 1 and report["summary"]["run_name"] == "r"
    # with a summary the input verdict is the summary's, not the trace's
    assert all(f["id"] != "input_bound" for f in report["traces"][0]["findings"])


def two_ranks_of_one_run(realtraces, folder) -> None:
    """Rank 0 of ddp_a100_rank0 (recorded as a world of 1) written as rank 0 of 2 beside ddp_a100_rank1_of2: two
    ranks of one run (the report keeps traces of different world sizes apart, as different runs)."""
    (rank0,) = find_traces(str(realtraces / "ddp_a100_rank0"))
    rewrite_trace(rank0, folder / os.path.basename(rank0), global_rank=0, world_size=2)
    for path in find_traces(str(realtraces / "ddp_a100_rank1_of2")):
        os.symlink(path, folder / os.path.basename(path))


def test_one_trace_file_and_several_ranks_in_one_folder(realtraces, tmp_path):
    report = build_report(str(realtraces / "ddp_a100_rank1_of2" / "test.json.gz"))
    assert len(report["traces"]) == 1 and report["ranks"] is None
    two_ranks_of_one_run(realtraces, tmp_path)
    report = build_report(str(tmp_path))
    ranks = report["ranks"]
    assert [row["rank"] for row in ranks["rows"]] == [0, 1]
    steps = [row["step_ms"] for row in ranks["rows"]]
    assert ranks["spread"]["step_ms"] == pytest.approx(max(steps) - min(steps), abs=0.002)


def test_report_command_prints_figures_and_findings_and_writes_the_png(realtraces, tmp_path, capsys):
    from matplotlib.image import imread

    from lightning_perf import cli

    two_ranks_of_one_run(realtraces, tmp_path)
    png = tmp_path / "chart.png"
    assert cli.main(["report", str(tmp_path), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "GPU timeline (HTA): idle 7.5%, compute 68.3%, non-compute 24.2%" in out
    assert "largest cudaMemcpyAsync from aten::item > aten::_local_scalar_dense" in out
    assert "Communication: 41.9 ms a step" in out
    assert "Across ranks:" in out and "Findings from this trace:" in out
    height, width, _ = imread(png).shape
    assert width == 1100 and height == 2 * 280  # one row a trace
    assert cli.main(["report", str(tmp_path), "--png", str(tmp_path / "missing" / "c.png")]) == 2
    assert "cannot write the chart" in capsys.readouterr().err
