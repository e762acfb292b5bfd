"""Trials measured like a benchmark tool: interleaved rounds, warm-up left out, intervals; plain CLI configs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from lightning_perf.analysis.summary import RunSummary
from lightning_perf.analysis.verdicts.statistics import SLOWER, MetricChange
from lightning_perf.cli import main
from lightning_perf.trial.api import run_trial
from lightning_perf.trial.spec import Variant
from tests.helpers import TinyDataModule, TinyModel

REPO_ROOT = Path(__file__).resolve().parents[2]
STEPS = 10


def test_run_trial_two_variants_three_rounds_interleaves_and_reports_intervals(tmp_path, capsys):
    variants = [
        Variant("fast", TinyModel, lambda: TinyDataModule(n=200), callback_kwargs={"enable_profiler": False}),
        Variant(
            "slow",
            lambda: TinyModel(step_delay_s=0.005),
            lambda: TinyDataModule(n=200),
            callback_kwargs={"enable_profiler": False},
        ),
    ]
    result = run_trial(variants, STEPS, log_dir=str(tmp_path), name="rounds", repeats=3, warmup_steps=2)
    out, err = capsys.readouterr()

    finished = re.findall(r"\[round (\d)/3 \d/2\] (\w+): done", err)
    # interleaved, the order rotated each round: A B, B A, A B
    assert finished == [
        ("1", "fast"),
        ("1", "slow"),
        ("2", "slow"),
        ("2", "fast"),
        ("3", "fast"),
        ("3", "slow"),
    ]
    for variant in result.variants:
        assert variant.ok and len(variant.rounds) == 3
        assert [Path(d).name for d in variant.round_dirs] == ["round_1", "round_2", "round_3"]
        for round_dir, kept in zip(variant.round_dirs, variant.rounds, strict=True):
            # the warm-up steps are left out of the round's figures, not out of its saved summary
            saved = RunSummary.load(round_dir)
            assert len(kept.timing.step_samples_ms) == len(saved.timing.step_samples_ms) - 2
        assert variant.summary is not None and len(variant.summary.timing.step_samples_ms) == 3 * (STEPS - 1)

    change = result.comparison.changes["slow"]
    assert isinstance(change, MetricChange)
    assert change.verdict == SLOWER and 1.0 < change.low <= change.ratio <= change.high
    assert change.confidence == 0.95 and "3 interleaved rounds" in change.method
    assert "slow is" in result.comparison.verdict and "95% interval" in result.comparison.verdict
    assert result.render() == out  # printed when progress is on
    assert (
        "method: paired t-interval" in out
        and "3 interleaved rounds (fast slow, the order rotated each round)" in out
    )


@pytest.mark.once  # rounds of real fits; the CLI parsing they share is tested on every Lightning
def test_trial_takes_a_plain_config_of_a_cli_with_fixed_classes(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    # what `LightningCLI(TinyModel, TinyDataModule)` reads: no class_path anywhere
    config = {
        "model": {"step_delay_s": 0.0},
        "data": {"n": 200, "batch_size": 4},
        "trainer": {"max_epochs": 1},
    }
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump(config))
    argv = ["trial", "--config", "plain.yaml", "--steps", "6", "--repeats", "1", "--warmup-steps", "1"]
    variants = ["--variant", "base", "--variant", "bigger:data.batch_size=8"]

    # without --cli the trial says how to name the CLI, before anything runs
    assert main([*argv, *variants]) == 2
    assert "--cli module:function" in capsys.readouterr().err

    assert main([*argv, "--cli", "tests.trial.cli_entry:fixed_classes", "--name", "fn", *variants]) == 0
    out = capsys.readouterr().out
    assert re.search(r"batch_size\s+4\s+8", out)
    assert main([*argv, "--cli", "tests.trial.cli_entry:FixedCLI", "--name", "sub", *variants]) == 0
    assert RunSummary.load(tmp_path / "perf_logs" / "sub" / "bigger").settings.batch_size == 8


@pytest.mark.parametrize("target", ["no_colon", "a:b:c", ":f"])
def test_cli_target_must_be_module_colon_attribute(tmp_path, capsys, monkeypatch, target):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump({"model": {"step_delay_s": 0.0}}))
    code = main(
        [
            "trial",
            "--config",
            "plain.yaml",
            "--steps",
            "4",
            "--cli",
            target,
            "--variant",
            "a",
            "--variant",
            "b",
        ]
    )
    assert code == 2 and "expected module:function" in capsys.readouterr().err
