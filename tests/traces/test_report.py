"""``lightning-perf report`` on run dirs made of real torch.profiler traces."""

from __future__ import annotations

import argparse
import json
import os
import shutil

import pytest

from lightning_perf.analysis.summary import SUMMARY_FILENAME, Finding, RunSummary, TimingSummary
from lightning_perf.cli import report as report_command
from lightning_perf.traces.figures import analysis as trace_analysis
from lightning_perf.traces.report import build as report
from tests.helpers import profile_tiny_loop


@pytest.fixture(scope="module")
def real_traces(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return profile_tiny_loop(str(tmp_path_factory.mktemp("traces")), cycles=2)


@pytest.fixture
def run_dir(real_traces, tmp_path) -> str:
    for path in real_traces:
        shutil.copy(path, tmp_path)
    return str(tmp_path)


def run_report(capsys, *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    report_command.add_arguments(parser)
    code = report_command.run(parser.parse_args(list(argv)))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_breakdown_of_each_step_sums_to_its_duration(run_dir, capsys):
    code, out, _ = run_report(capsys, run_dir, "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert [t["file"] for t in data["traces"]] == sorted(os.listdir(run_dir))
    for trace in data["traces"]:
        assert len(trace["steps"]) == 3
        for step in trace["steps"]:
            total = sum(step["categories_ms"].values())
            # within 1%, plus the rounding of eight values to the microsecond
            assert abs(total - step["duration_ms"]) <= 0.01 * step["duration_ms"] + 8 * 0.0005
            assert step["categories_ms"]["dataloader"] > 0  # user_annotation spans counted
        # exact on the unrounded figures
        for step in trace_analysis.step_breakdown(trace_analysis.load_trace(trace["path"]).spans).steps:
            assert sum(step.categories.values()) == pytest.approx(step.duration, rel=1e-9)


def test_json_format_has_stable_keys(run_dir, capsys):
    _, out, _ = run_report(capsys, run_dir, "--format", "json", "--top", "3")
    data = json.loads(out)
    assert data["schema"] == report.REPORT_SCHEMA and data["schema_version"] == report.REPORT_SCHEMA_VERSION
    assert data["summary"] is None and data["findings"] == []
    assert any(SUMMARY_FILENAME in note for note in data["notes"])
    trace = data["traces"][0]
    assert set(trace) == {
        "path", "file", "rank", "world_size", "events", "steps", "average", "device_aligned",
        "dropped_tail_steps", "kernel_busy_pct", "top_cpu_operators", "top_kernels", "figures", "findings",
        "skipped_events", "skip_reason", "backend", "process", "started_us", "alignment", "overlapping_steps",
    }  # fmt: skip
    assert set(trace["average"]["categories_ms"]) == set(trace_analysis.CATEGORIES)
    assert sum(trace["average"]["categories_pct"].values()) == pytest.approx(100, abs=0.5)
    assert len(trace["top_cpu_operators"]) == 3
    assert set(trace["top_cpu_operators"][0]) == {"name", "calls", "self_ms", "total_ms"}
    selfs = [op["self_ms"] for op in trace["top_cpu_operators"]]
    assert selfs == sorted(selfs, reverse=True)
    assert trace["kernel_busy_pct"] is None and trace["top_kernels"] == []


def test_markdown_contains_the_breakdown_table(run_dir, capsys):
    code, out, _ = run_report(capsys, run_dir, "--format", "markdown")
    assert code == 0
    header = "| Step | Total | DataLoader | CPU Exec | Kernel | Memcpy | Memset | Communication | Runtime | Other |"
    assert out.count(header) == 2  # one table per trace
    assert "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|" in out
    assert "| Average |" in out and "no GPU kernels recorded" in out
    assert "| Self ms | Total ms | Calls | Name |" in out


def test_text_format(run_dir, capsys):
    code, out, err = run_report(capsys, run_dir)
    assert code == 0 and err == ""
    assert out.count("Step breakdown (ms):") == 2
    assert "GPU kernel-busy: no GPU kernels recorded" in out
    assert f"no {SUMMARY_FILENAME}" in out
    assert "CPU operators by self time" in out


def test_findings_from_the_summary(run_dir, capsys):
    finding = Finding(
        id="input-bound",
        severity="warning",
        title="Training is input-bound",
        evidence="DataLoader wait is 42.0% of step time",
        recommendation="Raise num_workers from 0 to 4.",
    )
    RunSummary(run_name="demo", timing=TimingSummary(steps=10, data_wait_pct=42.0), findings=[finding]).save(
        os.path.join(run_dir, SUMMARY_FILENAME)
    )
    code, out, _ = run_report(capsys, run_dir)
    assert code == 0
    for text in (
        "Training is input-bound",
        "DataLoader wait is 42.0% of step time",
        "Raise num_workers",
        "demo",
    ):
        assert text in out
    _, out, _ = run_report(capsys, run_dir, "--format", "json")
    data = json.loads(out)
    keys = ("id", "severity", "title", "evidence", "recommendation", "settings_change")
    assert data["findings"] == [{key: getattr(finding, key) for key in keys}]
    assert data["summary"]["run_name"] == "demo" and data["summary"]["data_wait_pct"] == 42.0
    _, out, _ = run_report(capsys, run_dir, "--format", "markdown")
    assert "**[warning] Training is input-bound**" in out


def test_summary_without_traces(tmp_path, capsys):
    RunSummary(run_name="only-summary").save(tmp_path / SUMMARY_FILENAME)
    code, out, _ = run_report(capsys, str(tmp_path), "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert data["traces"] == [] and data["summary"]["run_name"] == "only-summary"
    assert any("no trace files" in note for note in data["notes"])


def test_a_corrupt_trace_is_listed_and_the_good_ones_reported_with_exit_code_1(run_dir, capsys):
    good = len(os.listdir(run_dir))
    bad = os.path.join(run_dir, "host_rank1.0001.pt.trace.json.gz")
    with open(os.path.join(run_dir, sorted(os.listdir(run_dir))[0]), "rb") as fh:
        data = fh.read()
    with open(bad, "wb") as fh:
        fh.write(data[: len(data) // 2])
    code, out, err = run_report(capsys, run_dir, "--format", "json")
    assert code == 1 and bad in err and "Traceback" not in err
    report_data = json.loads(out)
    assert len(report_data["traces"]) == good
    assert [u["file"] for u in report_data["unreadable"]] == [os.path.basename(bad)]
    assert bad in report_data["unreadable"][0]["error"]


def test_nothing_readable_gives_exit_code_2_naming_the_files(tmp_path, capsys):
    bad = tmp_path / "host_rank0.1.pt.trace.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "name": "A", "ts": 1, "dur": 2}')
    code, out, err = run_report(capsys, str(tmp_path))
    assert code == 2 and out == ""
    assert str(bad) in err and "Traceback" not in err


def test_corrupt_summary_is_listed_beside_the_readable_traces(run_dir, capsys):
    path = os.path.join(run_dir, SUMMARY_FILENAME)
    with open(path, "w") as fh:
        fh.write('{"schema": "lightning-perf/run-summary", "schema_vers')
    code, out, err = run_report(capsys, run_dir)
    assert code == 1 and path in err and "Traceback" not in err
    assert "Unreadable: perf_summary.json" in out and "Step breakdown" in out


def test_events_with_impossible_times_are_skipped_and_said(tmp_path, capsys):
    events = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#3",
            "ts": 0,
            "dur": 100,
            "pid": 1,
            "tid": 1,
        },
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 10, "dur": 20, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "no_dur", "ts": 10, "pid": 1, "tid": 1, "dur": None},
        {"ph": "X", "cat": "cpu_op", "name": "neg", "ts": 10, "dur": -5, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "inf", "ts": 10, "dur": float("inf"), "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "nan_ts", "ts": float("nan"), "dur": 1, "pid": 1, "tid": 1},
    ]
    (tmp_path / "h_rank0.1.pt.trace.json").write_text(json.dumps({"traceEvents": events}))
    for fmt in ("text", "markdown", "json"):
        code, out, _ = run_report(capsys, str(tmp_path), "--format", fmt)
        assert code == 0
        assert "inf" not in out.lower().replace("info", "") and "nan" not in out.lower()
        assert "4 event(s)" in out or '"skipped_events": 4' in out
    assert json.loads(out)["traces"][0]["top_cpu_operators"][0]["name"] == "aten::mm"


@pytest.mark.parametrize("make_dir", [False, True])
def test_missing_or_empty_dir_gives_exit_code_2(tmp_path, capsys, make_dir):
    target = tmp_path / "run"
    if make_dir:
        target.mkdir()
        (target / "notes.txt").write_text("not a trace")
    code, _, err = run_report(capsys, str(target))
    assert code == 2 and str(target) in err


def test_top_must_be_positive(run_dir, capsys):
    with pytest.raises(SystemExit) as info:
        run_report(capsys, run_dir, "--top", "0")
    assert info.value.code == 2
    assert "--top must be a positive integer" in capsys.readouterr().err


def test_cli_dispatches_report(run_dir, capsys):
    from lightning_perf import cli

    assert cli.main(["report", run_dir, "--format", "json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["traces"]) == 2


def test_gpu_trace_reports_kernels_and_busy_share(tmp_path, capsys):
    def x(name, cat, ts, dur, pid=1, tid=1, **args):
        return {
            "ph": "X",
            "name": name,
            "cat": cat,
            "ts": ts,
            "dur": dur,
            "pid": pid,
            "tid": tid,
            "args": args,
        }

    events = [
        x("ProfilerStep#7", "user_annotation", 0, 100),
        x("aten::mm", "cpu_op", 10, 20),
        x("cudaLaunchKernel", "cuda_runtime", 15, 5, correlation=1),
        x("sgemm", "kernel", 20, 30, pid=0, tid=7, correlation=1),  # [20, 50]
        x("cudaLaunchKernel", "cuda_runtime", 40, 5, correlation=2),
        x("sgemm", "kernel", 60, 20, pid=0, tid=7, correlation=2),  # [60, 80]
    ]
    path = tmp_path / "gpu_rank0.1.pt.trace.json"
    path.write_text(json.dumps({"schemaVersion": 1, "distributedInfo": {"rank": 0}, "traceEvents": events}))
    code, out, _ = run_report(capsys, str(tmp_path), "--format", "json")
    assert code == 0
    (trace,) = json.loads(out)["traces"]
    assert trace["rank"] == 0
    assert trace["kernel_busy_pct"] == 50.0  # kernels cover 30 + 20 of the 100 us step
    assert trace["top_kernels"] == [{"name": "sgemm", "calls": 2, "self_ms": 0.05, "total_ms": 0.05}]
    assert trace["steps"][0]["categories_ms"]["kernel"] == 0.05
    _, out, _ = run_report(capsys, str(tmp_path))
    assert "Top 1 GPU kernels:" in out and "50.0% of the profiled steps" in out


def test_a_cpu_only_gloo_trace_is_reported_not_a_crash(tmp_path, capsys):
    """A CPU ddp_spawn run's trace: a gloo collective, no GPU kernel (three events crashed the breakdown)."""

    def x(name, cat, ts, dur, external_id):
        return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": 1,
                "args": {"External id": external_id}}  # fmt: skip

    events = [
        x("ProfilerStep#3", "user_annotation", 1000, 500, 1),
        x("gloo:all_reduce", "cpu_op", 1100, 100, 2),
        x("aten::mm", "cpu_op", 1250, 100, 3),
    ]
    (tmp_path / "host_rank0.1.pt.trace.json").write_text(json.dumps({"traceEvents": events}))
    code, out, _ = run_report(capsys, str(tmp_path), "--format", "json")
    assert code == 0
    (trace,) = json.loads(out)["traces"]
    assert trace["average"]["categories_ms"]["communication"] == pytest.approx(0.1)
