"""Ctrl-C (SIGINT) or SIGTERM to `lightning-perf tune` while a round's DataLoader workers are stalled in
``__getitem__`` (a hung file system, a crowded machine): tune ends with 130 / 143 and nothing of the round's
process group or session is left running (issue 54)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
# seconds tune has to end after the signal: a hang guard, not a timing (it ends in well under a second)
HANG_GUARD_S = 60
# a start-up, a diagnosis fit and a round on a busy 2-core machine
START_GUARD_S = 240


def config(stall_file: Path) -> dict:
    return {
        # 20 ms a step: a round takes seconds, so the stall lands inside one
        "model": {"class_path": "tests.helpers.TinyModel", "init_args": {"step_delay_s": 0.02}},
        "data": {
            "class_path": "tests.trial.stalled_data.StallingDataModule",
            "init_args": {"stall_file": str(stall_file), "num_workers": 2},
        },
        "trainer": {"max_epochs": 1},
    }


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(config(tmp_path / "stall")))
    return tmp_path


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def round_processes(leader: int) -> list[int]:
    """The live processes of the round whose worker is ``leader``: its process group or its session."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(ProcessLookupError, PermissionError, psutil.Error):
            if leader in (os.getpgid(proc.pid), os.getsid(proc.pid)) and _running(proc):
                found.append(proc.pid)
    return found


def survivors(pids: list[int], leader: int, timeout_s: float = 15.0) -> list[int]:
    """What is still running of ``pids`` and of the round's group and session after ``timeout_s`` (a SIGKILLed
    process may take a moment to go on a busy machine); killed once found, so that a failing test leaves no
    DataLoader worker sleeping out its hour."""
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    left = sorted({p.pid for p in alive if _running(p)} | set(round_processes(leader)))
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


def stalled_loaders(stall_file: Path) -> dict[int, list[int]]:
    """The DataLoader workers stalled now, by their process group (the round's worker's pid)."""
    groups: dict[int, list[int]] = {}
    for marker in stall_file.parent.glob(stall_file.name + ".stalled.*"):
        pid = int(marker.name.rsplit(".", 1)[1])
        with contextlib.suppress(ProcessLookupError, psutil.Error):
            if _running(psutil.Process(pid)):
                groups.setdefault(os.getpgid(pid), []).append(pid)
    return groups


def tune_command() -> list[str]:
    return [sys.executable, "-c", "import sys; from lightning_perf.cli import main; sys.exit(main())"] + [
        "tune",
        "--config",
        "exp.yaml",
        "--steps",
        "10",
        "--repeats",
        "2",
    ]


@pytest.mark.once  # signals and process groups: the same on every Lightning
@pytest.mark.timeout(400)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_tune_during_a_round_with_stalled_loader_workers_ends_it_and_the_round(project, signum):
    stall = project / "stall"
    leader = 0  # the round's worker, once known
    with open(project / "err.txt", "w") as err:
        proc = subprocess.Popen(
            tune_command(),
            stdout=subprocess.DEVNULL,
            stderr=err,
            # Ctrl-C as a terminal's process has it (an ignored SIGINT would be inherited and the signal lost)
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    try:
        deadline = time.monotonic() + START_GUARD_S
        experiment = project / "perf_logs" / "exp_tune"
        while not list(experiment.glob("*/round_1/trial_worker.log")):  # the diagnosis is over, a round runs
            assert proc.poll() is None, (project / "err.txt").read_text()[-2000:]
            assert time.monotonic() < deadline, "no measured round started"
            time.sleep(0.1)
        stall.touch()  # the running round's DataLoader workers stall at their next samples
        groups: dict[int, list[int]] = {}
        while not any(len(loaders) == 2 for loaders in groups.values()):
            assert proc.poll() is None, (project / "err.txt").read_text()[-2000:]
            assert time.monotonic() < deadline, "the round's DataLoader workers never stalled"
            time.sleep(0.1)
            groups = stalled_loaders(stall)
        (leader,) = [group for group, loaders in groups.items() if len(loaders) == 2]
        worker = psutil.Process(leader)
        assert worker.ppid() == proc.pid and "cli_main" in " ".join(worker.cmdline())  # a round of this tune
        members = round_processes(leader)
        assert set(groups[leader]) < set(members)

        proc.send_signal(signum)  # to tune only, as Ctrl-C, `timeout` or a scheduler does
        code = proc.wait(timeout=HANG_GUARD_S)
    except BaseException:  # a failure before the signal: no DataLoader worker is left sleeping out its hour
        for pid in stalled_loaders(stall).get(leader, []):
            os.kill(pid, signal.SIGKILL)
        raise
    finally:
        if proc.poll() is None:
            proc.kill()
    left = survivors(members, leader)  # killed once found
    err = (project / "err.txt").read_text()
    assert code == EXIT_CODES[signum], err[-2000:]
    assert not left
    assert "the runs done are kept" in err
    assert not (project / "exp.tuned.yaml").exists()


# tune, run with its Popen slowed down: the worker starts, then Popen returns only once the worker's DataLoader
# workers stall, and the signal comes before that (the window between fork and Popen's return, where the
# parent does not know the worker's pid yet, is a few ms on a quiet machine and longer on a crowded one; here it
# is stretched so that what a signal in it leaves behind shows)
DRIVER = f"""
import os, signal, subprocess, sys, time
sys.path.insert(0, {str(REPO_ROOT)!r})
from tests.trial.test_tune_interrupt_stalled import stalled_loaders
from pathlib import Path
from lightning_perf.cli import main

signum, stall, leader_file = signal.Signals[sys.argv[1]], Path(sys.argv[2]), sys.argv[3]
signal.signal(signal.SIGINT, signal.default_int_handler)


class SignalledWhileStarting(subprocess.Popen):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "lightning_perf.trial.project.cli_main" not in " ".join(map(str, args[0])):
            return  # not a round's worker
        deadline = time.monotonic() + {START_GUARD_S}
        while len(stalled_loaders(stall).get(self.pid, [])) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        with open(leader_file, "w") as handle:
            handle.write(str(self.pid))
        os.kill(os.getpid(), signum)


subprocess.Popen = SignalledWhileStarting
sys.exit(main(["tune", "--config", "exp.yaml", "--steps", "10", "--repeats", "2"]))
"""


@pytest.mark.once  # signals and process groups: the same on every Lightning
@pytest.mark.timeout(400)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_the_round_starts_ends_the_round_it_started(project, signum):
    stall = project / "stall"
    stall.touch()  # the diagnosis's own DataLoader workers stall
    leader_file = project / "leader"
    with open(project / "err.txt", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", DRIVER, signum.name, str(stall), str(leader_file)],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        code = proc.wait(timeout=START_GUARD_S + HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    leader = int(leader_file.read_text())
    # the signal was held until the worker's pid was known, then its group went: its stalled DataLoader
    # workers, which never look at their parent while they sleep, with it
    left = survivors([leader, *stalled_loaders(stall).get(leader, [])], leader)  # killed once found
    assert code == EXIT_CODES[signum], (project / "err.txt").read_text()[-2000:]
    assert not left
