"""The commands on bad paths and corrupt summaries: one error line and exit code 2, never a traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lightning_perf import cli
from lightning_perf.analysis.summary import SUMMARY_FILENAME, Distribution, RunSummary, TimingSummary


def write_run(directory, median: float) -> str:
    timing = TimingSummary(steps=20, samples=80, step_time_ms=Distribution.of([10.0, 11.0, 12.0]))
    summary = RunSummary(run_name=os.path.basename(directory), timing=timing)
    path = os.path.join(directory, SUMMARY_FILENAME)
    summary.save(path)
    data = json.loads(Path(path).read_text())
    data["timing"]["step_time_ms"]["median"] = median
    with open(path, "w") as fh:
        fh.write(json.dumps(data))  # NaN written as the literal NaN, as a hand edit or a foreign tool could
    return path


@pytest.mark.parametrize("median", [float("nan"), -3.0, float("inf")])
def test_compare_rejects_an_impossible_step_time_as_corrupt(tmp_path, capsys, median):
    write_run(tmp_path / "a", 11.0)
    bad = write_run(tmp_path / "b", median)
    code = cli.main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--no-tensorboard"])
    err = capsys.readouterr().err
    assert code == 2 and bad in err and "timing.step_time_ms.median" in err and "Traceback" not in err


def test_compare_png_into_a_missing_dir_is_an_error_line(tmp_path, capsys):
    write_run(tmp_path / "a", 11.0)
    write_run(tmp_path / "b", 12.0)
    png = tmp_path / "no" / "such" / "chart.png"
    code = cli.main(
        ["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--no-tensorboard", "--png", str(png)]
    )
    err = capsys.readouterr().err
    assert code == 2 and "ENOENT" in err and str(png) in err
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]


def test_trial_log_dir_that_is_a_file_is_an_error_line(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text("model: {class_path: tests.helpers.TinyModel}\n")
    blocker = tmp_path / "logs"
    blocker.write_text("a file, not a directory")
    code = cli.main(["trial", "--config", str(tmp_path / "c.yaml"), "--steps", "3", "--variant", "a",
                     "--variant", "b", "--log-dir", str(blocker)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "ENOTDIR" in err and str(blocker) in err and "Traceback" not in err
