"""Issue 25's trial: two DataLoader workers against none on a loader that sleeps per sample.

Two workers deliver batches in pairs, so the step times of ``w2`` are bimodal and their median jumps between the
modes from round to round; the mean step time (what training waits for) is about half of ``a``'s in every round.
The verdict must say ``w2`` is faster with an interval above 1, in the text, the JSON and the chart.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from lightning_perf.cli import main

REPO_ROOT = Path(__file__).resolve().parents[2]
# 4 ms a sample, 8 samples a batch: 32 ms of loading a batch in the main process, about half with 2 workers;
# one epoch holds every step (no worker restarts inside a round)
DATA_ARGS = {"n": 400, "batch_size": 8, "delay_s": 0.004}
STEPS = 16


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    config = {
        "model": {"class_path": "tests.helpers.TinyModel"},
        "data": {"class_path": "tests.helpers.TinyDataModule", "init_args": DATA_ARGS},
        "trainer": {"max_epochs": 1, "enable_checkpointing": False},
    }
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(config))
    return tmp_path


@pytest.mark.once  # statistics and rounds, timed by sleeps: the same on every Lightning
def test_two_workers_against_none_are_called_faster_with_an_interval_above_one(workdir, capsys):
    png = workdir / "trial.png"
    argv = ["trial", "--config", "exp.yaml", "--steps", str(STEPS), "--repeats", "3", "--png", str(png)]
    argv += ["--variant", "a", "--variant", "w2:data.init_args.num_workers=2"]
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out

    # text: the verdict and the table cell read one way, the interval's both ends above 1
    verdict = next(line for line in out.splitlines() if line.startswith("verdict: "))
    found = re.search(
        r"w2 is ([\d.]+)x faster than a \(mean step time, 95% interval ([\d.]+)x-([\d.]+)x\)", verdict
    )
    assert found, out
    factor, low, high = map(float, found.groups())
    assert 1.0 < low <= factor <= high and factor > 1.5, out
    mean_row = next(line for line in out.splitlines() if line.strip().startswith("mean step time"))
    cell = re.search(r"\(([\d.]+)x faster, ([\d.]+)-([\d.]+)x\)", mean_row)
    assert cell and 1.0 < float(cell[2]) <= float(cell[1]) <= float(cell[3]), mean_row
    assert "method: paired t-interval of the log per-round ratios (3 interleaved rounds" in out

    # JSON: the same change, its fields named for their direction
    data = json.loads((workdir / "perf_logs" / "exp" / "comparison.json").read_text())
    change = data["changes"]["w2"]
    assert change["kind"] == "time" and change["direction"] == "faster" and change["significant"]
    assert 1.0 < change["speedup_low"] <= change["speedup"] <= change["speedup_high"]
    assert change["speedup"] == pytest.approx(factor, abs=0.01)
    assert change["slowdown"] is None and change["time_ratio_high"] < 1.0
    throughput = next(m for m in data["metrics"] if m["key"] == "samples_per_sec")["changes"][1]
    assert throughput["direction"] == "faster" and throughput["speedup_low"] > 1.0
    # the chart is drawn from the same comparison (its title is the verdict, its bars the same rows)
    assert png.read_bytes().startswith(b"\x89PNG")
