"""`tune -- python train.py` on a small CNN (issue 44): the low_mfu finding proposes compute fixes, each measured in
the interleaved rounds with its interval and the rounds' training loss beside it, compile time kept apart.

torch.compile runs with the "eager" backend here (LIGHTNING_PERF_COMPILE_BACKEND): dynamo traces and the compiled
forward runs, without inductor's code generation (~20 s a first compile on a 2-core machine).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from tests.trial.test_tune_any_project import copy_project, lightning_perf

BF16, COMPILE = "precision_bf16-mixed", "torch.compile"


@pytest.mark.once  # timed rounds: the same on every Lightning
@pytest.mark.timeout(560)
def test_tune_on_a_small_cnn_measures_bf16_and_torch_compile_with_the_rounds_loss(tmp_path, monkeypatch):
    monkeypatch.setenv("LIGHTNING_PERF_COMPILE_BACKEND", "eager")
    project = copy_project("cnn_script", tmp_path)
    args = [
        "--steps",
        "10",
        "--repeats",
        "2",
        # room for the two rounds beside two CPU hogs (~170 s of rounds there); a quiet machine ends sooner
        "--budget-s",
        "420",
        "--allow-semantic-changes",
        "--format",
        "json",
    ]
    done = lightning_perf(project, "tune", *args, "--", sys.executable, "train.py")
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert "low_mfu" in [f["id"] for f in result["findings"]], result["findings"]
    candidates = {c["name"]: c for c in result["candidates"]}
    assert candidates[BF16]["findings"] == candidates[COMPILE]["findings"] == ["low_mfu"]
    assert candidates[BF16]["semantic"] and not candidates[COMPILE]["semantic"]
    speeds = {s["name"]: s for s in result["speeds"]}
    figures = result["figures"]
    for name in (BF16, COMPILE):
        speed = speeds[name]
        assert speed["error"] is None and speed["rounds"] >= 2, speed
        assert speed["low"] <= speed["speedup"] <= speed["high"], speed  # measured, with its interval
        assert figures[name]["loss_rounds"] >= 2 and math.isfinite(figures[name]["loss"])
        # the same seeded script: a change of numerics still trains to about the baseline's loss
        assert figures[name]["loss"] == pytest.approx(figures["baseline"]["loss"], abs=0.05)
    assert figures[COMPILE]["compile_s"] > 0 and figures["baseline"]["compile_s"] is None
    # each round applied its setting: the fit ran in bf16, or compiled with the compile steps left out
    variants = {v["name"]: v for v in result["trial"]["variants"]}
    for name, check in (
        (BF16, lambda s: s["settings"]["precision"] == "bf16-mixed"),
        (COMPILE, lambda s: s["compile"]["compiles"] >= 1 and s["settings"]["precision"] == "32-true"),
    ):
        for round_dir in variants[name]["round_dirs"]:
            assert check(json.loads(Path(project, round_dir, "perf_summary.json").read_text())), round_dir
