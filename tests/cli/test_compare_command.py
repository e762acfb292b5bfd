"""`lightning-perf compare` end to end: saved summaries -> table, exit codes, PNG, TensorBoard, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_perf.analysis.run_discovery import find_runs, natural_key
from lightning_perf.analysis.summary import (
    SUMMARY_FILENAME,
    CpuUtilization,
    Distribution,
    RunSummary,
    Settings,
    TimingSummary,
    UtilizationSummary,
)
from lightning_perf.cli import main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CONSOLE_SCRIPT = Path(sys.executable).parent / "lightning-perf"


def save_run(
    directory: Path, step_ms: float, data_wait_pct: float, num_workers: int, steps: int = 40
) -> Path:
    """A run's log dir holding the perf_summary.json a run with these figures would write."""
    batch = 32
    times = [step_ms * f for f in (0.95, 1.0, 1.0, 1.05, 1.4)] if steps else []
    RunSummary(
        run_name=directory.name,
        log_dir=str(directory),
        timing=TimingSummary(
            steps=steps,
            samples=steps * batch,
            step_time_ms=Distribution.of(times),
            data_wait_ms=Distribution.of([t * data_wait_pct / 100.0 for t in times]),
            data_wait_pct=data_wait_pct if steps else None,
            samples_per_sec=batch * 1000.0 / step_ms if steps else None,
        ),
        utilization=UtilizationSummary(
            gpu_unavailable_reason="no GPU", cpu=CpuUtilization(process_cpu_pct=100.0, cpu_count=2)
        ),
        settings=Settings(num_workers=num_workers, batch_size=batch, host="node1", torch_version="2.14.1"),
    ).save(directory / SUMMARY_FILENAME)
    return directory


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    """num_workers 0 (slow, data-bound) and num_workers 2 (fast, little data wait) under logs/exp."""
    root = tmp_path / "logs" / "exp"
    return (
        save_run(root / "workers0", step_ms=100.0, data_wait_pct=45.0, num_workers=0),
        save_run(root / "workers2", step_ms=60.0, data_wait_pct=3.1, num_workers=2),
    )


def compare(*args: object) -> int:
    return main(["compare", *map(str, args)])


def test_table_shows_data_wait_drop_and_speedup(runs, capsys):
    workers0, workers2 = runs
    assert compare(workers0, workers2, "--no-tensorboard") == 0
    out = capsys.readouterr().out
    setting_line = next(line for line in out.splitlines() if "num_workers" in line)
    assert setting_line.split() == ["num_workers", "0", "2"]
    wait_line = next(line for line in out.splitlines() if "data wait" in line)
    # summaries without per-step samples: no interval, so sizes only, never judged better or faster
    assert "45.0%" in wait_line and "3.1% (-41.9 pts, no interval)" in wait_line
    assert "64.8 ms (1.67x lower, no interval)" in out  # the mean step time (1.08x these runs' medians)
    assert (
        "verdict: workers2 is 1.67x faster than workers0 (mean step time; no interval: no per-step samples); "
        "throughput 320.0 samples/s -> 533.3 samples/s; data wait 45.0% -> 3.1%" in out
    )
    assert not (workers0.parent / "perf_compare").exists()


def test_fail_if_slower_gate(runs, capsys):
    workers0, workers2 = runs
    assert compare(workers0, workers2, "--fail-if-slower", 5, "--no-tensorboard") == 0
    capsys.readouterr()
    assert compare(workers2, workers0, "--fail-if-slower", 5, "--no-tensorboard") == 1
    err = capsys.readouterr().err
    assert "workers0 is 66.7% slower than workers2" in err and "--fail-if-slower 5%" in err
    # the same regression stays under a generous limit
    assert compare(workers2, workers0, "--fail-if-slower", 70, "--no-tensorboard") == 0
    # choosing the baseline by name flips the judgement
    assert (
        compare(workers2, workers0, "--baseline", "workers0", "--fail-if-slower", 5, "--no-tensorboard") == 0
    )


@pytest.mark.parametrize("value", ["-1", "abc", "nan"])
def test_fail_if_slower_must_be_a_non_negative_percentage(runs, capsys, value):
    with pytest.raises(SystemExit) as exc:
        compare(*runs, f"--fail-if-slower={value}")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--fail-if-slower" in err and ">= 0" in err


def test_png_is_written(runs, tmp_path, capsys):
    png = tmp_path / "compare.png"
    assert compare(*runs, "--png", png, "--no-tensorboard") == 0
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    assert compare(*runs, "--png", tmp_path / "missing_dir" / "c.png", "--no-tensorboard") == 2
    assert "--png" in capsys.readouterr().err


def _read_tensorboard(directory: Path) -> EventAccumulator:
    acc = EventAccumulator(str(directory), size_guidance={"tensors": 0, "images": 0})
    acc.Reload()
    return acc


def test_tensorboard_run_beside_the_runs(runs):
    workers0, workers2 = runs
    assert compare(workers0, workers2) == 0
    out_dir = workers0.parent / "perf_compare"  # the runs' common log root
    assert list(out_dir.glob("events.out.tfevents.*"))
    acc = _read_tensorboard(out_dir)
    texts = acc.Tensors("perf_text/comparison/text_summary")
    markdown = texts[0].tensor_proto.string_val[0].decode()
    assert "64.8 ms (1.67x lower, no interval)" in markdown and "| `num_workers` | `0` | `2` |" in markdown
    images = acc.Images("perf_images/comparison_chart")
    assert images[0].encoded_image_string[:8] == PNG_SIGNATURE and images[0].width > 0
    # a second comparison replaces the first: one comparison in the run
    assert compare(workers2, workers0) == 0
    acc = _read_tensorboard(out_dir)
    steps = {event.step: event for event in acc.Tensors("perf_text/comparison/text_summary")}
    assert sorted(steps) == [0]
    assert "workers0 is 1.67x slower" in steps[0].tensor_proto.string_val[0].decode()


def test_tensorboard_dir_option(runs, tmp_path):
    chosen = tmp_path / "tb" / "compare_run"
    assert compare(*runs, "--tensorboard-dir", chosen) == 0
    assert _read_tensorboard(chosen).Tags()["tensors"] == ["perf_text/comparison/text_summary"]
    assert not (runs[0].parent / "perf_compare").exists()


def test_json_and_markdown_formats(runs, capsys):
    assert compare(*runs, "--format", "json", "--no-tensorboard") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["run_names"] == ["workers0", "workers2"] and data["baseline"] == "workers0"
    assert data["settings_diff"] == {"num_workers": [0, 2]}
    step = next(m for m in data["metrics"] if m["key"] == "step_time_median_ms")
    assert step["values"] == [pytest.approx(100.0), pytest.approx(60.0)]
    assert step["ratios"][1] == pytest.approx(0.6)
    assert compare(*runs, "--format", "markdown", "--no-tensorboard") == 0
    out = capsys.readouterr().out
    assert (
        out.startswith("### Performance comparison")
        and "| metric | `workers0` (baseline) | `workers2` |" in out
    )


def test_environment_difference_is_flagged(runs, tmp_path, capsys):
    other = save_run(tmp_path / "logs" / "exp" / "other_host", step_ms=60.0, data_wait_pct=3.1, num_workers=2)
    summary = RunSummary.load(other)
    summary.settings.host = "node2"
    summary.save(other / SUMMARY_FILENAME)
    for fmt in ("text", "markdown", "json"):
        assert compare(runs[0], other, "--format", fmt, "--no-tensorboard") == 0
        assert "runs come from different environments (host: node1 / node2)" in capsys.readouterr().out


def test_log_root_discovery_with_natural_sorting(tmp_path, capsys):
    root = tmp_path / "lightning_logs"
    for version, step_ms in ((10, 50.0), (2, 80.0), (0, 100.0)):
        save_run(root / f"version_{version}", step_ms=step_ms, data_wait_pct=10.0, num_workers=version)
    (root / "version_3").mkdir()  # no summary: not a run of this tool, not listed
    found = find_runs([str(root)])
    assert [name for name, _ in found] == ["version_0", "version_2", "version_10"]
    assert [Path(d) for _, d in found] == [root / "version_0", root / "version_2", root / "version_10"]
    assert compare(root, "--no-tensorboard") == 0
    header = capsys.readouterr().out.splitlines()[2]
    assert header.split() == ["version_0", "(baseline)", "version_2", "version_10"]
    assert sorted(["v10", "v2", "V1"], key=natural_key) == ["V1", "v2", "v10"]


def test_baseline_by_path_outside_the_runs(runs, capsys):
    workers0, workers2 = runs
    assert compare(workers2, "--baseline", workers0, "--format", "json", "--no-tensorboard") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["run_names"] == ["workers0", "workers2"] and data["baseline"] == "workers0"
    assert compare(*runs, "--baseline", "nope", "--no-tensorboard") == 2
    err = capsys.readouterr().err
    assert "--baseline 'nope'" in err and "workers0, workers2" in err


def _assert_error(capsys, *args: object, names: str) -> str:
    assert compare(*args, "--no-tensorboard") == 2
    captured = capsys.readouterr()
    assert names in captured.err and "Traceback" not in captured.err
    assert captured.out == ""
    return captured.err


def test_missing_corrupt_and_partial_summaries_are_errors(runs, tmp_path, capsys):
    workers0, workers2 = runs
    no_summary = tmp_path / "logs" / "exp" / "crashed"
    no_summary.mkdir()
    _assert_error(capsys, workers0, no_summary, names=str(no_summary))
    _assert_error(capsys, workers0, tmp_path / "does_not_exist", names=str(tmp_path / "does_not_exist"))

    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    text = (workers2 / SUMMARY_FILENAME).read_text()
    (corrupt / SUMMARY_FILENAME).write_text(text[: len(text) // 2])  # truncated mid-write
    _assert_error(capsys, workers0, corrupt, names=str(corrupt / SUMMARY_FILENAME))

    malformed = tmp_path / "malformed"
    malformed.mkdir()
    data = json.loads(text)
    data["timing"] = None
    (malformed / SUMMARY_FILENAME).write_text(json.dumps(data))
    err = _assert_error(capsys, workers0, malformed, names=str(malformed / SUMMARY_FILENAME))
    assert "timing" in err

    partial = save_run(tmp_path / "partial", step_ms=60.0, data_wait_pct=3.1, num_workers=2, steps=0)
    err = _assert_error(capsys, workers0, partial, names=str(partial / SUMMARY_FILENAME))
    assert "partial" in err and "--allow-partial" in err
    assert compare(workers0, partial, "--allow-partial", "--no-tensorboard") == 0
    out = capsys.readouterr().out
    assert "partial is a partial summary" in out
    assert "n/a" in next(line for line in out.splitlines() if "median step time" in line)
    # a gate cannot pass a run it could not measure
    assert compare(workers0, partial, "--allow-partial", "--fail-if-slower", 5, "--no-tensorboard") == 2


def test_roots_without_runs_and_single_runs_are_errors(runs, tmp_path, capsys):
    empty_root = tmp_path / "empty_logs"
    (empty_root / "version_0").mkdir(parents=True)
    err = _assert_error(capsys, empty_root, names=str(empty_root))
    assert f"no {SUMMARY_FILENAME}" in err
    err = _assert_error(capsys, runs[0], names=str(runs[0]))
    assert "at least two runs" in err


def test_console_script(runs, tmp_path):
    assert CONSOLE_SCRIPT.exists(), f"console script not installed at {CONSOLE_SCRIPT}"
    workers0, workers2 = runs
    ok = subprocess.run(
        [CONSOLE_SCRIPT, "compare", workers0.parent, "--png", tmp_path / "c.png"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert "64.8 ms (1.67x lower, no interval)" in ok.stdout and "45.0%" in ok.stdout and "3.1%" in ok.stdout
    assert (tmp_path / "c.png").read_bytes()[:8] == PNG_SIGNATURE
    assert _read_tensorboard(workers0.parent / "perf_compare").Tags()["images"] == [
        "perf_images/comparison_chart"
    ]

    slower = subprocess.run(
        [CONSOLE_SCRIPT, "compare", workers2, workers0, "--fail-if-slower", "5", "--no-tensorboard"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert slower.returncode == 1 and "workers0 is 66.7% slower" in slower.stderr

    (workers0 / SUMMARY_FILENAME).write_text("{not json")
    broken = subprocess.run(
        [CONSOLE_SCRIPT, "compare", workers0, workers2, "--no-tensorboard"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert broken.returncode == 2
    assert str(workers0 / SUMMARY_FILENAME) in broken.stderr and "Traceback" not in broken.stderr


def test_runs_are_labelled_by_name_or_by_their_settings(runs, capsys):
    workers0, workers2 = runs
    assert compare(workers0, workers2, "--label", "before", "--label", "after", "--no-tensorboard") == 0
    out = capsys.readouterr().out
    assert "after is 1.67x faster than before" in out
    assert compare(workers0, workers2, "--label-from-settings", "--no-tensorboard") == 0
    assert "num_workers=2 is 1.67x faster than num_workers=0" in capsys.readouterr().out
    assert compare(workers0, workers2, "--label", "only-one", "--no-tensorboard") == 2
    assert "--label: given 1 labels for 2 runs" in capsys.readouterr().err
