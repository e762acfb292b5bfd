"""The prepared GPU check runs in its CPU mode: real fits, the GPU-only checks reported as skipped."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_check.py"
GPU_ONLY = (
    "NVML identity",
    "sampler truth",
    "no per-step sync",
    "step time vs CUDA events",
    "data wait vs GPU idle",
    "cudnn.benchmark A/B restores state",
    "GPU clocks and memory series",
    "case study on the GPU",
)
ON_CPU = ("end-to-end fit", "memory timeline", "trace cost and cap", "MFU and measured peak")


def test_dry_run_prints_and_writes_one_table_with_every_check(tmp_path):
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    checks = {c["name"]: c for c in json.loads((tmp_path / "gpu_check.json").read_text())["checks"]}
    assert set(checks) == set(GPU_ONLY) | set(ON_CPU)
    for name in GPU_ONLY:
        assert checks[name]["status"].startswith("skipped (no GPU)"), checks[name]
    for name in ON_CPU:
        assert checks[name]["status"] == "pass", checks[name]
    assert "2 traces" in checks["end-to-end fit"]["detail"]
    assert (
        "warned" in checks["trace cost and cap"]["detail"]
        and checks["trace cost and cap"]["figures"]["kb_per_step"] > 0
    )
    table = (tmp_path / "gpu_check.txt").read_text()
    assert table in run.stdout and "0 failed" in table
    for name in (*GPU_ONLY, *ON_CPU):
        assert name.split(" ")[0] in table


def test_a_check_that_raises_is_a_failed_row_not_a_lost_table(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    gpu_check = pytest.importorskip("gpu_check")

    def check_broken(ctx):
        raise RuntimeError("boom")

    monkeypatch.setattr(gpu_check, "CHECKS", [check_broken])
    (row,) = gpu_check.run_checks(gpu_check.Context(gpu=False, dry_run=True, work="."))

    assert (row.name, row.status) == ("broken", "fail") and "RuntimeError: boom" in row.detail
    assert gpu_check.skipped("x", "what is missing").status == "skipped: what is missing"
    assert "broken" in gpu_check.render([row], "header")
