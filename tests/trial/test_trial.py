"""`lightning-perf trial` and `run_trial`: real short fits per variant, failures reported, then the comparison."""

from __future__ import annotations

import glob
import json
import os
import re
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from lightning.pytorch import Callback
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_perf.analysis.summary import RunSummary
from lightning_perf.analysis.verdicts.comparison_render import from_json
from lightning_perf.cli import main
from lightning_perf.output.comparison_chart import TEXT_TAG
from lightning_perf.trial.api import run_trial
from lightning_perf.trial.runner import PROTOCOL_PREFIX, run_worker
from lightning_perf.trial.spec import DEFAULT_WARMUP_STEPS, TrialError, Variant
from lightning_perf.trial.worker import TrialProgress
from lightning_perf.tune.variants import parse_variant
from tests.helpers import TinyDataModule, TinyModel, loader

REPO_ROOT = Path(__file__).resolve().parents[2]
# 2 ms per sample, 4 samples a batch: a DataLoader cost that num_workers=2 changes; enough batches for the steps
DATA_ARGS = {"n": 200, "batch_size": 4, "delay_s": 0.002}
STEPS = 8


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh working dir holding ``exp.yaml``; the tests' modules import through PYTHONPATH, as a user's would."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    config = {
        "model": {"class_path": "tests.helpers.TinyModel"},
        "data": {"class_path": "tests.helpers.TinyDataModule", "init_args": DATA_ARGS},
        # the trial's step budget wins over a config's single epoch
        "trainer": {"max_epochs": 1, "limit_train_batches": 4},
        "ckpt_path": None,  # as in a config saved by `fit`
    }
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(config))
    return tmp_path


def trial(*argv: str) -> int:
    try:
        return main(["trial", "--config", "exp.yaml", "--steps", str(STEPS), *argv])
    except SystemExit as exit_:  # argparse's own errors
        return int(exit_.code or 0)


@pytest.mark.once  # rounds of real fits; the CLI parsing they share is tested on every Lightning
def test_cli_trial_runs_each_variant_as_its_own_run_and_compares_them(workdir, capsys):
    config = yaml.safe_load((workdir / "exp.yaml").read_text())
    config["trainer"]["callbacks"] = [
        # the user's own PerfCallback is kept with its arguments (no second one is added)
        {"class_path": "lightning_perf.PerfCallback", "init_args": {"utilization": False}},
        # would fail without validation and clash with checkpointing off: the trial leaves them out
        {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"monitor": "val_loss"}},
        {"class_path": "lightning.pytorch.callbacks.EarlyStopping", "init_args": {"monitor": "val_loss"}},
    ]
    (workdir / "exp.yaml").write_text(yaml.safe_dump(config))
    png = workdir / "trial.png"
    code = trial(
        "--repeats",
        "2",
        "--png",
        str(png),
        "--variant",
        "baseline",
        "--variant",
        "workers2:data.init_args.num_workers=2",
    )
    out, err = capsys.readouterr()
    assert code == 0, err

    experiment = workdir / "perf_logs" / "exp"  # --name defaults to the config's stem
    for name, workers in (("baseline", 0), ("workers2", 2)):
        for round_dir in (experiment / name / "round_1", experiment / name / "round_2"):
            summary = RunSummary.load(round_dir)
            assert summary.status == "finished"
            # warm-up steps run too; the first batch of the epoch is timed apart
            assert 0 < summary.timing.steps <= STEPS + DEFAULT_WARMUP_STEPS
            assert summary.settings.num_workers == workers
            assert summary.utilization.cpu is None  # the user's PerfCallback(utilization=False) measured it
            assert glob.glob(str(round_dir / "events.out.tfevents.*"))
    # the table names both variants and the setting that differs; the change has an interval and a method
    assert "baseline" in out and "workers2" in out
    assert re.search(r"num_workers\s+0\s+2", out)
    assert (
        "verdict:" in out
        and "method: paired t-interval of the log per-round ratios (2 interleaved rounds" in out
    )
    assert "2 interleaved rounds (baseline workers2, the order rotated each round)" in out
    # progress on stderr: a bar, and a line per round as it ends, interleaved A B, B A
    finished = re.findall(r"\[round (\d)/2 (\d)/2\] (\w+): done in [\d.]+ s \(mean step [\d.]+ ms\)", err)
    assert finished == [
        ("1", "1", "baseline"),
        ("1", "2", "workers2"),
        ("2", "2", "workers2"),  # the order rotates each round
        ("2", "1", "baseline"),
    ]
    assert "step/s" in err or "s/step" in err  # tqdm's rate (and ETA) on the bar
    assert png.read_bytes().startswith(b"\x89PNG")
    # the comparison as JSON and as its own TensorBoard run
    comparison = from_json(json.loads((experiment / "comparison.json").read_text()))
    assert comparison.run_names == ["baseline", "workers2"] and comparison.baseline == "baseline"
    assert comparison.settings_diff["num_workers"] == [0, 2]
    events = EventAccumulator(str(experiment / "perf_compare"))
    events.Reload()
    assert f"{TEXT_TAG}/text_summary" in events.Tags()["tensors"]

    # a second trial of the same names would mix stale runs in: refused before anything runs
    assert trial("--variant", "baseline", "--variant", "other") == 2
    assert "--name" in capsys.readouterr().err


@pytest.mark.once  # statistics and rounds, timed by sleeps: the same on every Lightning
def test_failed_variants_are_reported_and_the_others_still_run_and_are_compared(workdir, capsys):
    code = trial(
        "--format",
        "json",
        "--repeats",
        "1",
        "--variant",
        "boom:model.init_args.fail_at_batch=2",  # the requested baseline raises in training_step
        "--variant",
        "baseline",
        "--variant",
        "typo:data.init_args.num_wrkers=2",  # no such argument
        "--variant",
        "workers2:data.init_args.num_workers=2",
    )
    out, err = capsys.readouterr()
    assert code == 1

    result = json.loads(out)  # stdout stays machine-readable: progress went to stderr
    status = {v["name"]: (v["status"], v["error"]) for v in result["variants"]}
    assert status["baseline"] == ("ok", None) and status["workers2"] == ("ok", None)
    assert status["boom"] == ("failed", "RuntimeError: injected failure")
    assert status["typo"][0] == "failed" and "num_wrkers" in status["typo"][1]
    assert "[1/4] boom: FAILED: RuntimeError: injected failure" in err
    assert re.search(r"\[3/4\] typo: FAILED: invalid config or override: .*num_wrkers", err)
    assert status["baseline"] == ("ok", None) and result["repeats"] == 1
    # the failed variant's full output is kept
    assert (
        "Traceback"
        in Path(next(v["log_path"] for v in result["variants"] if v["name"] == "boom")).read_text()
    )

    comparison = result["comparison"]
    assert comparison["run_names"] == ["baseline", "workers2"] and comparison["baseline"] == "baseline"
    assert any("'boom' failed" in note and "'baseline'" in note for note in result["notes"])
    saved = json.loads((workdir / "perf_logs" / "exp" / "comparison.json").read_text())
    assert saved["run_names"] == ["baseline", "workers2"]
    # the trial added its own PerfCallback, with its defaults (utilization measured)
    assert RunSummary.load(workdir / "perf_logs" / "exp" / "baseline").utilization.cpu is not None


class FlagRecorder(Callback):
    """Records torch.backends.cudnn.benchmark as the variant's training starts."""

    def __init__(self) -> None:
        self.benchmark: bool | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.benchmark = torch.backends.cudnn.benchmark


def test_python_api_runs_variants_in_process_and_restores_cudnn_benchmark(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    plain, tuned = FlagRecorder(), FlagRecorder()

    def broken_model() -> TinyModel:
        raise ValueError("no such model")

    variants = [
        Variant("baseline", TinyModel, lambda: TinyDataModule(**DATA_ARGS), {"callbacks": [plain]}),
        Variant("broken", broken_model, lambda: TinyDataModule(**DATA_ARGS)),
        Variant(
            "cudnn",
            TinyModel,
            lambda: loader(**DATA_ARGS),  # a plain DataLoader works too
            {"benchmark": True, "callbacks": [tuned]},
            {"enable_profiler": False},
        ),
    ]
    result = run_trial(variants, steps=STEPS, log_dir=str(tmp_path / "logs"), name="api", repeats=1)
    out, err = capsys.readouterr()

    # the cudnn variant ran with benchmark on, and the flag is back to what it was
    assert plain.benchmark is False and tuned.benchmark is True
    assert torch.backends.cudnn.benchmark is False

    assert [v.name for v in result.failed] == ["broken"]
    assert result.failed[0].error == "ValueError: no such model"
    assert "[2/3] broken: FAILED: ValueError: no such model" in err
    assert re.search(r"\[3/3\] cudnn: done in", err)
    for variant in result.succeeded:
        assert variant.summary_path == str(tmp_path / "logs" / "api" / variant.name / "perf_summary.json")
        assert RunSummary.load(variant.summary_path).timing.steps > 0
    assert result.comparison is not None
    assert result.comparison.run_names == ["baseline", "cudnn"]
    assert result.comparison.settings_diff["cudnn_benchmark"] == [False, True]
    assert os.path.isfile(result.comparison_path)
    assert "cudnn_benchmark" in out and "broken: ValueError: no such model" in out


def test_python_api_rejects_bad_arguments_before_running(tmp_path):
    variant = Variant("a", TinyModel, lambda: TinyDataModule(**DATA_ARGS))
    with pytest.raises(TrialError, match="at least two variants"):
        run_trial([variant], steps=5, log_dir=str(tmp_path))
    with pytest.raises(TrialError, match="steps must be an integer >= 2"):
        run_trial([variant, Variant("b", TinyModel, TinyDataModule)], steps=0, log_dir=str(tmp_path))
    with pytest.raises(TrialError, match="max_steps are set by the trial"):
        run_trial(
            [variant, Variant("b", TinyModel, TinyDataModule, {"max_steps": 3})],
            steps=5,
            log_dir=str(tmp_path),
        )
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize(
    ("argv", "flag", "message"),
    [
        (["--variant", "baseline"], "--variant", "at least two variants"),
        (["--variant", "a", "--variant", "a:trainer.benchmark=true"], "--variant", "unique, repeated: a"),
        (["--variant", "a", "--variant", "b:num_workers"], "--variant", "malformed override 'num_workers'"),
        (["--variant", "a", "--variant", "b:"], "--variant", "no override after ':'"),
        (["--variant", "a", "--variant", "b/c"], "--variant", "letters, digits"),
        (["--variant", "a", "--variant", "b:trainer.max_steps=3"], "--variant", "set by the trial"),
        (["--steps", "0", "--variant", "a", "--variant", "b"], "--steps", "integer >= 2"),
        (["--steps", "1", "--variant", "a", "--variant", "b"], "--steps", "timed apart"),
        (["--steps", "two", "--variant", "a", "--variant", "b"], "--steps", "invalid int value"),
        (["--config", "missing.yaml", "--variant", "a", "--variant", "b"], "--config", "no such file"),
        (["--timeout-s", "0", "--variant", "a", "--variant", "b"], "--timeout-s", "> 0"),
    ],
)
def test_argument_errors_exit_2_naming_the_flag(workdir, capsys, argv, flag, message):
    assert trial(*argv) == 2
    err = capsys.readouterr().err
    assert flag in err and message in err
    assert not (workdir / "perf_logs").exists()  # nothing ran


def test_config_without_a_model_is_an_argument_error(workdir, capsys):
    (workdir / "exp.yaml").write_text(yaml.safe_dump({"trainer": {"max_epochs": 1}}))
    assert trial("--variant", "a", "--variant", "b") == 2
    assert "--config exp.yaml: no `model` given" in capsys.readouterr().err


def test_parse_variant_splits_overrides_only_before_a_key():
    assert parse_variant("baseline").pair == ("baseline", [])
    assert parse_variant(
        "multi:trainer.devices=[0,1],trainer.benchmark=true,data.init_args.x={a: 1, b: 2}"
    ).pair == (
        "multi",
        [("trainer.devices", "[0,1]"), ("trainer.benchmark", "true"), ("data.init_args.x", "{a: 1, b: 2}")],
    )
    with pytest.raises(TrialError, match="given twice"):
        parse_variant("x:trainer.benchmark=true,trainer.benchmark=false")


@pytest.mark.parametrize(
    ("steps", "expected"), [(15, [2, 4, 6, 8, 10, 12, 14, 15]), (3, [1, 2, 3]), (1, [1])]
)
def test_progress_reports_about_every_tenth_and_the_last_step(steps, expected):
    seen: list[tuple[int, int]] = []
    progress = TrialProgress(steps, lambda done, total: seen.append((done, total)))
    for step in range(1, steps + 1):
        progress.on_train_batch_end(SimpleNamespace(global_step=step), None, None, None, step - 1)
    assert seen == [(k, steps) for k in expected]


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_run_worker_stops_a_hung_worker_and_its_children_at_the_timeout(tmp_path):
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print('child', child.pid, flush=True)\n"
        f"print({PROTOCOL_PREFIX!r} + 'progress 3 10', flush=True)\n"
        "time.sleep(60)\n"
    )
    log = tmp_path / "worker.log"
    seen: list[tuple[int, int]] = []
    error = run_worker(python(code), "", str(log), timeout_s=1.0, on_progress=lambda *p: seen.append(p))
    assert error == "timed out after 1 s at step 3/10; the worker was stopped"
    assert seen == [(3, 10)]
    child = int(re.search(r"child (\d+)", log.read_text()).group(1))
    assert wait_until_gone(child)  # a DataLoader worker would not outlive the variant


@pytest.mark.timeout(60)
def test_run_worker_returns_when_the_worker_exits_leaving_a_child_holding_its_output(tmp_path):
    code = (
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        "print('child', child.pid, flush=True)\n"
        f"print({PROTOCOL_PREFIX!r} + 'done', flush=True)\n"
    )
    log = tmp_path / "worker.log"
    assert run_worker(python(code), "", str(log)) is None  # no timeout given: it must not wait for the child
    assert wait_until_gone(int(re.search(r"child (\d+)", log.read_text()).group(1)))


def wait_until_gone(pid: int, tries: int = 50) -> bool:
    for _ in range(tries):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):  # killed, waiting to be reaped by init
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (
            "import sys; print('first'); print('cannot import x'); sys.exit(3)",
            "exited with code 3: cannot import x",
        ),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "exited with signal SIGKILL"),
        ("print('all good')", "ended without reporting a result"),
        (f"print({PROTOCOL_PREFIX!r} + 'error ValueError: bad'); raise SystemExit(1)", "ValueError: bad"),
        (f"import sys; sys.stdin.read(); print({PROTOCOL_PREFIX!r} + 'done')", None),
    ],
)
def test_run_worker_turns_each_ending_into_one_line(tmp_path, code, expected):
    error = run_worker(python(code), "{}", str(tmp_path / "worker.log"))
    if expected is None:
        assert error is None
    else:
        assert error is not None and error.endswith(expected)
