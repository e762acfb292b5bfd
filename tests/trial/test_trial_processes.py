"""trial/tune rounds as processes: every way the parent goes ends the worker's process group, no round waits
forever (a limit derived from the measured pace), the budget stops rounds, a disturbed round is named."""

from __future__ import annotations

import contextlib
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

from lightning_perf.analysis.summary import MachineState, RunSummary
from lightning_perf.cli import main
from lightning_perf.trial import progress as progress_module
from lightning_perf.trial import runner
from lightning_perf.trial.progress import Progress
from lightning_perf.trial.runner import (
    PROTOCOL_PREFIX,
    RoundLimits,
    RoundReport,
    disturbance,
    own_pace,
    run_worker,
)
from lightning_perf.trial.spec import DEFAULT_WARMUP_STEPS, VariantResult

REPO_ROOT = Path(__file__).resolve().parents[2]
# a fit slow enough to be caught mid-way: 100 ms a step, DataLoader workers loading 10 ms a sample
SLOW_FIT = {
    "model": {"class_path": "tests.helpers.TinyModel", "init_args": {"step_delay_s": 0.1}},
    "data": {
        "class_path": "tests.helpers.TinyDataModule",
        "init_args": {"n": 400, "batch_size": 4, "delay_s": 0.01, "num_workers": 2},
    },
}
# a worker that starts a child in its own process group (as a DataLoader worker is), reports a step, then
# ends ("done") or hangs; it writes "<its pid> <the child's pid>" to argv[1] first
FAKE_WORKER = f"""
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
with open(sys.argv[1] + '.tmp', 'w') as fh:
    fh.write(f'{{os.getpid()}} {{child.pid}}')
os.replace(sys.argv[1] + '.tmp', sys.argv[1])
print({PROTOCOL_PREFIX!r} + 'progress 1 10', flush=True)
if sys.argv[2] == 'done':
    print({PROTOCOL_PREFIX!r} + 'done', flush=True)
    sys.exit(0)
time.sleep(300)
"""
# the parent: runs the fake worker through run_worker, as a shell would start it (SIGINT and SIGHUP as default,
# or SIGHUP ignored as under nohup); "raise": the caller fails while the round runs
DRIVER = f"""
import signal, sys
from lightning_perf.trial.runner import run_worker
pids, mode, log = sys.argv[1:4]
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGHUP, signal.SIG_IGN if mode == 'nohup' else signal.SIG_DFL)

def on_progress(done, steps):
    if mode == 'raise':
        raise RuntimeError('the caller failed')

worker = [sys.executable, '-c', {FAKE_WORKER!r}, pids, 'done' if mode == 'done' else 'hang']
print('returned', run_worker(worker, '', log, on_progress=on_progress), flush=True)
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's project dir; its classes import through PYTHONPATH, as a user's would."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    return tmp_path


def python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


def still_running(pids: list[int], timeout_s: float = 15.0) -> list[int]:
    """The pids still running (zombies waiting for their reaper count as gone) after ``timeout_s``."""
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    return [p.pid for p in alive if _running(p)]


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def group_members(pgid: int) -> list[int]:
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and _running(proc):
                members.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return members


def wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 60.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, f"the parent ended early: {proc.returncode}"
        assert time.monotonic() < deadline, "the worker never started"
        time.sleep(0.05)
    return [int(pid) for pid in path.read_text().split()]


@pytest.mark.once  # signals and process groups: the same on every Lightning
@pytest.mark.timeout(300)
def test_sigterm_to_trial_ends_its_worker_and_dataloader_workers(project):
    (project / "exp.yaml").write_text(yaml.safe_dump(SLOW_FIT))
    with open(project / "out.txt", "w") as out, open(project / "err.txt", "w") as err:
        proc = subprocess.Popen(
            python("import sys; from lightning_perf.cli import main; sys.exit(main())")
            + ["trial", "--config", "exp.yaml", "--steps", "300", "--repeats", "1"]
            + ["--variant", "baseline", "--variant", "other:model.init_args.step_delay_s=0.05"],
            stdout=out,
            stderr=err,
        )
    try:
        worker, loaders = None, []
        deadline = time.monotonic() + 240
        while len(loaders) < 2:  # the worker's DataLoader workers are running: the fit is under way
            assert proc.poll() is None, (project / "err.txt").read_text()[-2000:]
            assert time.monotonic() < deadline, "the DataLoader workers never started"
            time.sleep(0.2)
            for child in psutil.Process(proc.pid).children():
                if "lightning_perf.trial.project.cli_main" in " ".join(child.cmdline()):
                    worker, loaders = child, child.children(recursive=True)
        assert worker is not None and os.getpgid(worker.pid) == worker.pid  # its own group, as before
        assert all(os.getpgid(p.pid) == worker.pid for p in loaders)

        proc.send_signal(signal.SIGTERM)  # what `timeout`, CI runners and SLURM send, to the command only
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not still_running([worker.pid, *(p.pid for p in loaders)])
    assert not group_members(worker.pid)
    assert "SIGTERM: the running worker and its processes were stopped" in (project / "err.txt").read_text()


@pytest.mark.parametrize(
    ("mode", "signum", "code"),
    [
        ("hang", signal.SIGTERM, 128 + signal.SIGTERM),
        ("hang", signal.SIGHUP, 128 + signal.SIGHUP),
        ("hang", signal.SIGINT, -signal.SIGINT),  # KeyboardInterrupt, as before: Python ends by SIGINT
        ("raise", None, 1),  # an exception in the parent while the round runs
        ("done", None, 0),  # a normal end: a child the worker left in its group goes too
    ],
)
def test_every_way_the_parent_leaves_a_round_ends_the_workers_process_group(tmp_path, mode, signum, code):
    pids = tmp_path / "pids"
    proc = subprocess.Popen(
        python(DRIVER, str(pids), mode, str(tmp_path / "worker.log")),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        worker, child = wait_for(pids, proc)
        if signum is not None:
            time.sleep(0.3)  # the driver is in its round
            proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err[-2000:]
    if mode == "done":
        assert "returned None" in out
    if mode == "raise":
        assert "RuntimeError: the caller failed" in err
    assert not still_running([worker, child])
    assert not group_members(worker)


def test_a_signal_the_parent_ignores_leaves_the_round_running(tmp_path):
    pids = tmp_path / "pids"
    proc = subprocess.Popen(
        python(DRIVER, str(pids), "nohup", str(tmp_path / "worker.log")),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        worker, child = wait_for(pids, proc)
        time.sleep(0.3)
        proc.send_signal(signal.SIGHUP)  # nohup: the round goes on
        time.sleep(1.0)
        assert proc.poll() is None and psutil.pid_exists(worker) and psutil.pid_exists(child)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM
    assert not still_running([worker, child])


@pytest.mark.once  # process lifetimes: the same on every Lightning
def test_a_worker_dies_with_a_parent_killed_outright(tmp_path):
    ready = tmp_path / "ready"
    worker_code = (
        "import os, sys, time\n"
        "from lightning_perf.trial.parent_death import die_with_parent\n"
        "die_with_parent()\n"
        f"open({str(ready)!r}, 'w').write(str(os.getpid()))\n"
        "time.sleep(300)\n"
    )
    driver = (
        "import sys\nfrom lightning_perf.trial.runner import run_worker\n"
        f"run_worker([sys.executable, '-c', {worker_code!r}], '', {str(tmp_path / 'w.log')!r})\n"
    )
    proc = subprocess.Popen(python(driver))
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() or not ready.read_text():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        worker = int(ready.read_text())
        proc.kill()  # SIGKILL: no handler runs in the parent
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not still_running([worker])


def test_a_round_that_reports_nothing_stops_at_the_start_up_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "STARTUP_TIMEOUT_S", 1.0)
    report = RoundReport()
    started = time.monotonic()
    error = run_worker(python("import time; time.sleep(300)"), "", str(tmp_path / "w.log"), report=report)
    assert time.monotonic() - started < 20
    assert error == (
        "timed out after 1 s; the worker was stopped (no --timeout-s and no step measured yet: 1 s for the "
        "start-up)"
    )
    assert report.stopped == "timeout" and report.limit_s == 1.0


def test_rounds_sharing_limits_take_the_first_finished_round_as_the_expected_time(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "ROUND_TIMEOUT_FACTOR", 3.0)
    monkeypatch.setattr(runner, "ROUND_TIMEOUT_FLOOR_S", 1.0)
    limits = RoundLimits()
    first = tmp_path / "baseline" / "round_1"
    first.mkdir(parents=True)
    done = f"import time; time.sleep(0.3); print({PROTOCOL_PREFIX!r} + 'done')"
    assert run_worker(python(done), "", str(first / "w.log"), limits=limits) is None
    assert limits.expected_from == "the first finished round, baseline/round_1"
    assert 0.3 <= limits.expected_s < 10

    heard: list[float] = []
    report = RoundReport()
    error = run_worker(
        python("import time; time.sleep(300)"),
        "",
        str(tmp_path / "w.log"),
        limits=limits,
        report=report,
        on_limit=lambda seconds, why: heard.append(seconds),
    )
    limit = max(1.0, 3.0 * limits.expected_s)
    assert heard == [limit] and report.limit_s == limit
    assert error == (
        f"timed out after {limit:.0f} s; the worker was stopped (no --timeout-s: 3x the expected round time "
        f"of {limits.expected_s:.1f} s (the first finished round, baseline/round_1), at least 1 s)"
    )
    # the user's --timeout-s wins over a derived limit
    error = run_worker(
        python("import time; time.sleep(300)"), "", str(tmp_path / "w.log"), 0.5, limits=limits
    )
    assert error == "timed out after 0.5 s; the worker was stopped"


def test_the_budget_stops_the_running_round_and_starts_none_after_it(tmp_path):
    limits = RoundLimits(budget_deadline=time.monotonic() + 1.0, budget_label="--budget-s 60")
    report = RoundReport()
    hang = f"import time; print({PROTOCOL_PREFIX!r} + 'progress 2 10', flush=True); time.sleep(300)"
    error = run_worker(python(hang), "", str(tmp_path / "w.log"), limits=limits, report=report)
    assert report.stopped == "budget" and limits.exhausted
    assert re.fullmatch(
        r"stopped at the budget \(--budget-s 60\) after \d+ s at step 2/10; the worker was stopped", error
    )
    marker = tmp_path / "started"
    error = run_worker(python(f"open({str(marker)!r}, 'w')"), "", str(tmp_path / "w.log"), limits=limits)
    assert error == "not run: the budget (--budget-s 60) is spent" and not marker.exists()
    assert limits.budget_note(2, 5) == "stopped at the budget (--budget-s 60): 2 of 5 rounds ran in full"


def test_a_rounds_own_pace_leaves_its_start_up_out_of_the_time_a_step():
    assert own_pace([(5.0, 0, 11)]) is None  # training began, no step yet
    expected, how = own_pace([(5.0, 0, 11), (5.5, 1, 11), (6.4, 4, 11)])
    assert expected == pytest.approx(6.4 + 7 * 0.3)
    assert how == "this round's pace: 300 ms a step over 11 steps after 5.0 s of start-up"
    expected, _ = own_pace([(4.0, 0, 10), (6.0, 2, 10)])  # one report: the pace since training began
    assert expected == pytest.approx(6.0 + 8 * 1.0)


def test_a_disturbed_round_is_named_with_the_load_it_saw(tmp_path, capsys):
    busy = RunSummary(machine=MachineState(cpu_count=2, other_cores=1.2, load_avg_1m=11.5))
    quiet = RunSummary(machine=MachineState(cpu_count=2, other_cores=0.1, load_avg_1m=0.4))
    assert disturbance(busy) == "other processes used 1.2 of 2 cores (60%), load average 11.5"
    assert disturbance(quiet) is None and disturbance(RunSummary()) is None

    # the worker says so, and the runner keeps it in the round's report
    report = RoundReport()
    worker = f"print({PROTOCOL_PREFIX!r} + 'disturbed ' + {disturbance(busy)!r}); print({PROTOCOL_PREFIX!r} + 'done')"
    assert run_worker(python(worker), "", str(tmp_path / "w.log"), report=report) is None
    assert report.disturbed == "other processes used 1.2 of 2 cores (60%), load average 11.5"

    # the round's line on the progress says it
    progress = Progress(2, 2, 10)
    progress.start(1, 1, "baseline", 10)
    progress.finished(VariantResult("baseline", str(tmp_path), rounds=[busy]), 1.0, 2.0)
    progress.start(1, 2, "other", 10)
    progress.finished(VariantResult("other", str(tmp_path), rounds=[quiet]), 1.0, 2.0)
    progress.close()
    err = capsys.readouterr().err
    assert (
        "[round 1/2 1/2] baseline: done in 1.0 s (mean step 2.0 ms); disturbed: other processes used 1.2 of 2 "
        "cores (60%), load average 11.5" in err
    )
    assert re.search(r"\[round 1/2 2/2\] other: done in 1.0 s \(mean step 2.0 ms\)\n", err)


def test_the_bar_says_how_long_a_round_has_waited_and_when_it_stops():
    progress = Progress(1, 1, 10, enabled=False)
    progress.start(1, 1, "baseline", 10)
    now = time.monotonic()
    assert progress.stalled(now) is None
    progress.limit(30.0, "why")
    progress._round_started = progress._last_step_at = now - 12.0
    said = progress.stalled(now)
    match = re.fullmatch(
        r"no new step for 12 s; stopped at (\d\d:\d\d:\d\d) if none comes \(18 s left\)", said
    )
    assert match, said
    deadline = time.strftime("%H:%M:%S", time.localtime(time.time() + 18.0))
    assert match[1] in {deadline, time.strftime("%H:%M:%S", time.localtime(time.time() + 17.0))}
    # five seconds later: the same time of day, fewer seconds left (a countdown that counts down)
    later = progress.stalled(now + 5.0)
    assert later == f"no new step for 17 s; stopped at {match[1]} if none comes (13 s left)"
    # the round's own pace moves the limit later: the note says so rather than move silently
    progress.limit(60.0, "pace")
    moved = progress.stalled(now + 5.0)
    assert f"later than the {match[1]} said before" in moved and "(43 s left" in moved
    progress.step(3, 10)
    assert progress.stalled() is None
    progress.step(10, 10)
    progress._last_step_at = now - 12.0
    assert progress.stalled(now).startswith("ending for 12 s after the last step")
    progress.close()


@pytest.mark.once  # rounds of real fits, timed: the same on every Lightning
@pytest.mark.timeout(240)
def test_a_round_that_sleeps_an_hour_ends_at_the_limit_derived_from_its_pace(project, monkeypatch, capsys):
    # small for the test: the round's limit is 1.5x its expected time (the default: 10x, at least 120 s)
    monkeypatch.setattr(runner, "ROUND_TIMEOUT_FACTOR", 1.5)
    monkeypatch.setattr(runner, "ROUND_TIMEOUT_FLOOR_S", 1.0)
    monkeypatch.setattr(progress_module, "STALL_NOTE_S", 1.0)
    monkeypatch.setattr(progress_module, "STALL_TICK_S", 0.5)
    monkeypatch.setattr(progress_module, "STALL_LINE_S", 2.0)
    config = {
        "model": {"class_path": "tests.trial.slow_models.SleepAtBatch"},
        "data": {"class_path": "tests.helpers.TinyDataModule", "init_args": {"n": 200, "batch_size": 4}},
    }
    (project / "exp.yaml").write_text(yaml.safe_dump(config))
    earlier = {p.pid for p in psutil.Process().children(recursive=True)}
    code = main(
        ["trial", "--config", "exp.yaml", "--steps", "8", "--repeats", "1", "--format", "json"]
        + ["--variant", "baseline", "--variant", "hung:model.init_args.sleep_at_batch=6"]
    )
    out, err = capsys.readouterr()
    assert code == 1, err[-2000:]
    result = json.loads(out)
    variants = {v["name"]: v for v in result["variants"]}
    assert variants["baseline"]["status"] == "ok"
    hung = variants["hung"]
    steps = 8 + DEFAULT_WARMUP_STEPS
    # the limit and how it was derived: the round's own pace, or the first finished round's time (the rounds
    # share their limits; with one round the runner names it by its experiment and variant folders)
    match = re.fullmatch(
        rf"timed out after (\d+) s at step 4/{steps}; the worker was stopped \(no --timeout-s: 1.5x the "
        r"expected round time of ([\d.]+) s \((this round's pace: \d+ ms a step over \d+ steps after [\d.]+ s "
        r"of start-up|the first finished round, (?:exp/)?baseline)\), at least 1 s\)",
        hung["error"],
    )
    assert match, hung["error"]
    assert int(match.group(1)) == pytest.approx(1.5 * float(match.group(2)), abs=1)
    assert hung["status"] == "failed" and hung["wall_s"] < 90  # not an hour
    # the bar did not freeze silently: a line said the round had no new step
    assert re.search(rf"\[2/2\] hung: no new step for \d+ s.* \(at step 4/{steps}\)", err)
    leftover = [p for p in psutil.Process().children(recursive=True) if p.pid not in earlier and _running(p)]
    assert not leftover
