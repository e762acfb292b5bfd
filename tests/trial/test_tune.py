"""`lightning-perf tune`: real fits of a Lightning CLI project, from the diagnosis to a verified tuned config."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from lightning_perf.cli import main
from lightning_perf.tune.run import run_tune

REPO_ROOT = Path(__file__).resolve().parents[2]
# 10 ms a sample, 4 samples a batch: 40 ms of loading per step, next to 40 ms of compute (a sleep), with no
# workers: a single worker already overlaps the two (about 1.9x), so even a 2-core machine has a real win.
INPUT_BOUND = {
    "model": {"class_path": "tests.helpers.TinyModel", "init_args": {"step_delay_s": 0.04}},
    "data": {
        "class_path": "tests.helpers.TinyDataModule",
        "init_args": {"n": 400, "batch_size": 4, "delay_s": 0.01},
    },
    "trainer": {"max_epochs": 1},
}
# slow storage: 50 ms a sample (a network file system), 4 samples a batch, 5 ms of compute: the loading waits, so
# the diagnosis asks for workers past the 2 cores
SLOW_STORAGE = {
    "model": {"class_path": "tests.helpers.TinyModel", "init_args": {"step_delay_s": 0.005}},
    "data": {
        "class_path": "tests.helpers.TinyDataModule",
        "init_args": {"n": 800, "batch_size": 4, "delay_s": 0.05},
    },
    "trainer": {"max_epochs": 1},
}
# compute only: a 20 ms step over an instant loader
COMPUTE_BOUND = {
    "model": {"class_path": "tests.helpers.TinyModel", "init_args": {"step_delay_s": 0.02}},
    "data": {"class_path": "tests.helpers.TinyDataModule", "init_args": {"n": 400, "batch_size": 4}},
}
STEPS = "10"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's project dir; its classes import through PYTHONPATH, as a user's would."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    return tmp_path


def write(path: Path, config: dict) -> bytes:
    text = "# my project's config\n" + yaml.safe_dump(config)
    path.write_text(text)
    return path.read_bytes()


def tune(*argv: str) -> int:
    try:
        return main(["tune", *argv])
    except SystemExit as exit_:  # argparse's own errors
        return int(exit_.code or 0)


@pytest.mark.once  # statistics and rounds, timed by sleeps: the same on every Lightning
def test_an_input_bound_config_tunes_to_more_workers_with_a_failing_candidate_reported(project):
    before = write(project / "exp.yaml", INPUT_BOUND)
    result = run_tune(
        "exp.yaml",
        steps=30,  # under a second a round here: transient load on the machine averages out over 30 steps
        repeats=3,  # three rounds: a t-interval with 2 degrees of freedom (4.3), enough for a 1.9x change
        extra=[("boom", [("model.init_args.fail_at_batch", "2")])],  # a candidate that crashes
    )
    text = result.render()
    # the diagnosis saw the loader and proposed a DataLoader change
    assert "input_bound" in [f.id for f in result.findings]
    # in tune's name, applied at run time; the tuned config names the key that fed it
    workers = next(c for c in result.candidates if "num_workers" in c.changes)
    assert workers.changes["num_workers"] >= 1
    # the crash is reported with its error; the others were compared
    speeds = {s.name: s for s in result.speeds}
    assert speeds["boom"].error == "RuntimeError: injected failure"
    assert "boom: failed: RuntimeError: injected failure" in text
    assert speeds[workers.name].rounds == 3 and speeds[workers.name].speedup is not None
    # the verdict: the workers change, significantly faster, in one line with its interval
    assert result.decision.winner == workers.name, text
    line = re.search(r"verdict: (.+): ([\d.]+)x faster \(95% interval ([\d.]+)-([\d.]+)x\)", text)
    assert line and line.group(1) == workers.label and float(line.group(3)) > 1.0, text
    # every round is a TensorBoard run; the comparison is saved as trial does
    experiment = project / "perf_logs" / "exp_tune"
    for name in ("baseline", workers.name):
        for i in (1, 2, 3):
            assert list((experiment / name / f"round_{i}").glob("events.out.tfevents.*"))
    assert (experiment / "comparison.json").is_file()
    assert json.loads(json.dumps(result.to_dict()))["decision"]["winner"] == workers.name

    # the tuned config is beside the original, which is byte-identical; a diff was printed
    assert (project / "exp.yaml").read_bytes() == before
    tuned = project / "exp.tuned.yaml"
    assert result.tuned_path == "exp.tuned.yaml" and f"wrote {tuned.name}" in text
    assert re.search(r"^\+\s+num_workers: \d+$", result.diff, re.M)
    loaded = yaml.safe_load(tuned.read_text())
    assert loaded["data"]["init_args"]["num_workers"] == workers.changes["num_workers"]
    # ... and a plain LightningCLI fits with it
    fit = subprocess.run(
        [
            sys.executable,
            "-c",
            "from lightning.pytorch.cli import LightningCLI; LightningCLI()",
            "fit",
            "--config",
            str(tuned),
            "--trainer.max_steps=2",
            "--trainer.logger=false",
            "--trainer.enable_checkpointing=false",
            "--trainer.enable_progress_bar=false",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert fit.returncode == 0, fit.stderr[-2000:]


@pytest.mark.once  # rounds timed by sleeps: the same on every Lightning
def test_slow_storage_tunes_to_workers_past_the_cores(project):
    write(project / "storage.yaml", SLOW_STORAGE)
    result = run_tune("storage.yaml", steps=12, repeats=3)
    text = result.render()
    finding = next(f for f in result.findings if f.id == "input_bound")
    assert "wait" in finding.evidence and not any("CPU-bound" in f.title for f in result.findings), text
    workers = next(c for c in result.candidates if "num_workers" in c.changes)
    assert workers.changes["num_workers"] > os.cpu_count(), text
    assert result.decision.winner is not None and "faster" in text, text
    tuned = yaml.safe_load((project / "storage.tuned.yaml").read_text())
    assert tuned["data"]["init_args"]["num_workers"] >= 2


@pytest.mark.once  # timed rounds: a config's tune tries what the command way tries (torch.compile for low_mfu)
def test_a_compute_bound_config_is_told_to_keep_its_config(project, capsys):
    before = write(project / "exp.yaml", COMPUTE_BOUND)
    code = tune("--config", "exp.yaml", "--steps", STEPS, "--repeats", "2")
    out, err = capsys.readouterr()
    if re.search(r"^verdict: not measured: the machine was busy .*keep your config", out, re.M):
        # beside CPU hogs: the diagnosis saw only the others holding the cores, or they disturbed the rounds
        assert code == 1, err
        assert re.search(r"^\s+\[high\] noisy_machine:", out, re.M) or " was disturbed: " in out, out
    else:
        assert code == 0, err
        assert re.search(r"^verdict: keep your config", out, re.M), out
    assert not (project / "exp.tuned.yaml").exists()
    assert (project / "exp.yaml").read_bytes() == before
    assert "diagnosis" in err  # the progress bar of the diagnosis fit, on stderr


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--config", "missing.yaml"], "--config missing.yaml: no such file"),
        (["--config", "exp.yaml", "--budget-s", "-5"], "--budget-s must be a number of seconds > 0, got -5"),
        (["--config", "exp.yaml", "--budget-s", "nan"], "--budget-s"),
        (["--config", "exp.yaml", "--repeats", "1"], "--repeats must be an integer >= 2"),
        (["--config", "exp.yaml", "--steps", "1"], "--steps must be an integer >= 2"),
        (["--config", "exp.yaml", "--variant", "nothing"], "--variant 'nothing': give its overrides"),
        (["--config", "exp.yaml", "--variant", "baseline:trainer.benchmark=true"], "--variant"),
    ],
)
def test_bad_input_is_refused_naming_the_argument(project, capsys, argv, named):
    write(project / "exp.yaml", COMPUTE_BOUND)
    assert tune(*argv) == 2
    err = capsys.readouterr().err
    assert f"lightning-perf tune: error: {named}" in err
    assert not (project / "perf_logs").exists()  # refused before anything ran


def test_a_budget_too_small_for_any_verdict_says_so_and_leaves_no_process(project, capsys):
    before = write(project / "exp.yaml", INPUT_BOUND)
    # processes other tests left running (e.g. the trace reader's forkserver) are not this run's
    earlier = {p.pid for p in psutil.Process().children(recursive=True)}
    code = tune("--config", "exp.yaml", "--steps", STEPS, "--budget-s", "1", "--format", "json")
    out, _ = capsys.readouterr()
    assert code == 1
    result = json.loads(out)
    assert result["decision"]["judged"] is False and result["tuned_config"] is None
    assert any("too small for any verdict" in n and "--budget-s 1" in n for n in result["notes"])
    assert (project / "exp.yaml").read_bytes() == before
    assert not [
        p for p in psutil.Process().children(recursive=True) if p.is_running() and p.pid not in earlier
    ]


@pytest.mark.once  # signals and process groups: the same on every Lightning
def test_ctrl_c_keeps_the_rounds_done_and_leaves_no_process(project):
    hang = project / "hang"
    model = {"class_path": "tests.trial.slow_models.HangsWhenTold", "init_args": {"hang_file": str(hang)}}
    write(project / "exp.yaml", {**INPUT_BOUND, "model": model})
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from lightning_perf.cli import main; sys.exit(main())"]
        + ["tune", "--config", "exp.yaml", "--steps", STEPS, "--repeats", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C as a terminal's process has it: an ignored SIGINT (left by an earlier test in this runner
        # process) would be inherited and the signal lost
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    experiment = project / "perf_logs" / "exp_tune"
    first_round = experiment / "baseline" / "round_1" / "perf_summary.json"
    deadline = time.monotonic() + 300
    while not first_round.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert first_round.exists(), "the first measured round never finished"
    hang.touch()  # the rounds after this one hang: the Ctrl-C below lands inside one, however fast they ran
    before = set(experiment.glob("*/round_*/trial_worker.log"))
    # the running round hangs at its next step, a round started after the file at its first: either way the
    # signal lands inside a round (no round can finish now, so none can be the last)
    settle = time.monotonic() + 3
    while proc.poll() is None and time.monotonic() < settle:
        if set(experiment.glob("*/round_*/trial_worker.log")) - before:
            break
        time.sleep(0.2)
    assert proc.poll() is None, "tune ended before a round could be interrupted"
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGINT)  # as Ctrl-C does, to the command only: it must stop its workers itself
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted; the runs done are kept" in err
    assert (
        first_round.exists()
        and (project / "perf_logs" / "exp_tune" / "diagnosis" / "perf_summary.json").exists()
    )
    assert not (project / "exp.tuned.yaml").exists()
    psutil.wait_procs(children, timeout=10)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert os.path.exists(project / "exp.yaml")
