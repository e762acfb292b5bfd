"""`lightning-perf trial` checks what it can before the first round (issue 25, point 6): a --log-dir that is a file
or cannot be written, an override value that does not parse; one error line, exit code 2, no round started."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_perf.trial.api import run_trial
from lightning_perf.trial.spec import TrialError, Variant
from tests.helpers import TinyDataModule, TinyModel
from tests.read_only import locked
from tests.trial.test_trial import trial, workdir  # noqa: F401  (workdir: the fixture)


def _refused_before_any_round(capsys, *argv: str) -> str:
    assert trial("--variant", "a", "--variant", "b:trainer.benchmark=true", *argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("lightning-perf trial: error: "), captured.err
    assert "round" not in captured.err and "Traceback" not in captured.err  # no progress bar, no worker
    assert captured.out == ""
    return lines[0]


def test_a_log_dir_that_is_a_file_is_refused_before_the_first_round(workdir, capsys):  # noqa: F811
    (workdir / "notes.txt").write_text("not a directory")
    line = _refused_before_any_round(capsys, "--log-dir", "notes.txt")
    assert f"--log-dir/--name: {workdir / 'notes.txt'} is a file, not a directory" in line
    assert (workdir / "notes.txt").read_text() == "not a directory"
    # and below a file
    line = _refused_before_any_round(capsys, "--log-dir", "notes.txt/logs")
    assert f"{workdir / 'notes.txt'} is a file" in line


def test_an_unwritable_log_dir_is_refused_before_the_first_round(workdir, capsys):  # noqa: F811
    folder = workdir / "locked"
    folder.mkdir()
    with locked(folder):  # also as root: the check writes a real file instead of asking access()
        line = _refused_before_any_round(capsys, "--log-dir", "locked/logs")
    assert f"{folder} is not writable (" in line and ("EACCES" in line or "EPERM" in line), line
    assert list(folder.iterdir()) == []  # the probe file is gone


def test_an_override_value_that_does_not_parse_is_refused_naming_it(workdir, capsys):  # noqa: F811
    assert trial("--variant", "a", "--variant", "b:data.init_args.sizes=[1,2") == 2
    err = capsys.readouterr().err
    assert "--variant 'b:data.init_args.sizes=[1,2': the value of data.init_args.sizes ('[1,2')" in err
    assert "does not parse as YAML" in err and len(err.splitlines()) == 1
    assert not (workdir / "perf_logs").exists()


def test_run_trial_refuses_a_log_dir_that_is_a_file_before_fitting(tmp_path: Path):
    (tmp_path / "file").write_text("")
    made = []

    def model():
        made.append(1)
        return TinyModel()

    variants = [Variant("a", model, TinyDataModule), Variant("b", model, TinyDataModule)]
    with pytest.raises(TrialError, match="is a file, not a directory"):
        run_trial(variants, steps=4, log_dir=str(tmp_path / "file"), progress=False)
    assert made == []  # no variant was built, no round ran
