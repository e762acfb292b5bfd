"""One guard for every command (issue 55): Ctrl-C, SIGTERM/SIGHUP (the trial's ``Terminated``), the project's
errors and an OSError each end a command in one line on stderr, the same words whichever command, no traceback,
with the shell's exit codes (130, 128 + the signal, 2)."""

from __future__ import annotations

import errno
import importlib
import signal
from pathlib import Path

import pytest

import lightning_perf.cli
from lightning_perf.cli import COMMANDS, main
from lightning_perf.trial.runner import Terminated
from lightning_perf.trial.spec import TrialError

# the least each command's parser takes
ARGV = {
    "compare": ["a", "b"],
    "trial": ["--steps", "4", "--variant", "a", "--variant", "b"],
    "report": ["run"],
    "tune": [],
    "capture": ["run"],
}
# trial and tune leave runs behind when stopped; they say so
KEPT = {"trial": "; the runs done are kept (0 run summaries under perf_logs)"}
KEPT["tune"] = KEPT["trial"] + "; no tuned config was written"


def test_every_command_is_listed_here():
    assert set(ARGV) == set(COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(
    ("stop", "code", "said"),
    [
        (KeyboardInterrupt(), 130, "interrupted{kept}"),
        (Terminated(signal.SIGTERM), 143, "terminated{kept}"),
        (Terminated(signal.SIGHUP), 129, "terminated{kept}"),
        (
            TrialError("--steps must be an integer >= 2, got 1"),
            2,
            "error: --steps must be an integer >= 2, got 1",
        ),
        (OSError(errno.EACCES, "Permission denied", "out.json"), 2, "error: out.json: "),
    ],
    ids=["ctrl-c", "sigterm", "sighup", "bad-input", "oserror"],
)
def test_a_command_stopped_or_refused_says_one_line(tmp_path, monkeypatch, capsys, command, stop, code, said):
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(COMMANDS[command])

    def body(args):
        raise stop

    monkeypatch.setattr(module, "_run", body)
    assert main([command, *ARGV[command]]) == code
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"lightning-perf {command}: " + said.format(kept=KEPT.get(command, ""))), lines
    if isinstance(stop, OSError):
        assert "EACCES" in lines[0]
    assert captured.out == ""


def test_the_commands_catch_ctrl_c_in_one_place():
    sources = sorted(Path(lightning_perf.cli.__file__).parent.glob("*.py"))
    places = {path.name: path.read_text().count("except KeyboardInterrupt") for path in sources}
    assert {name: n for name, n in places.items() if n} == {"common.py": 1}
