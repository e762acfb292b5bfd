"""Hostile files where a fit looks for its own (issue 36): a capture request that is not a file, and a run with
no logger whose folder could shadow the package.

Real fits: the request is read by the training thread at its logging windows, so a request that blocks (a FIFO)
or never ends (a link to ``/dev/zero``) would stop the fit itself. Their timeouts use pytest-timeout's thread
method, which ends the process: on the old code the fit sat 20 minutes in ``open`` on the FIFO (the kernel's
``wait_for_partner``), past both a 120 s signal-method timeout and the SIGTERM of ``timeout 600`` (a signal
another thread takes does not interrupt the main thread's blocked call).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lightning_perf import PerfCallback
from lightning_perf.collect.profiling.capture_request import (
    MAX_REQUEST_BYTES,
    REQUEST_FILENAME,
    RequestInbox,
    write_request,
)
from lightning_perf.output.loggers import NO_LOGGER_DIR
from tests.callback.test_long_runs import callback as long_runs_callback
from tests.helpers import TinyModel, loader, trainer

pytestmark = pytest.mark.slow
# 16 batches of 4, a window every 4: the request is looked at 3 or 4 times during the fit
BATCHES, WINDOW = 16, 4
IGNORED = "ignoring the capture request"
# a timeout that ends the process (stack dumps first) instead of a SIGALRM the blocked thread may never see
HARD_TIMEOUT = pytest.mark.timeout(120, method="thread")


def quiet_callback(**kwargs) -> PerfCallback:
    """test_long_runs' quiet callback, with this file's window and no diagnosis."""
    return long_runs_callback(**{"log_every_n_steps": WINDOW, "diagnose": False, **kwargs})


def fit_with_request(tmp_path, make_request, caplog) -> tuple[PerfCallback, str, list[str]]:
    """A fit whose run dir holds what ``make_request(path)`` put under the request's name before it started;
    returns the callback, the request's path and the warnings about it."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    path = str(run_dir / REQUEST_FILENAME)
    make_request(path)
    callback = quiet_callback(dirpath=str(run_dir))
    with caplog.at_level(logging.WARNING, logger="lightning_perf"):
        trainer(tmp_path, [callback], limit_train_batches=BATCHES, limit_val_batches=0).fit(
            TinyModel(), loader(n=BATCHES * 4)
        )
    warned = [r.getMessage() for r in caplog.records if IGNORED in r.getMessage()]
    return callback, path, warned


def assert_fit_ended_normally(callback: PerfCallback) -> None:
    summary = callback.last_summary
    assert summary is not None and summary.status == "finished"
    assert summary.timing.steps == BATCHES - 1  # the first batch of an epoch is timed apart
    assert not [t for t in summary.traces if "_capture." in t.path], "nothing was captured"


@HARD_TIMEOUT
@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero on this platform")
def test_a_request_linked_to_dev_zero_is_ignored_with_one_warning_and_the_fit_ends(tmp_path, caplog):
    """Before: a device reports size 0, so the size check passed and the fit read /dev/zero without end."""
    callback, path, warned = fit_with_request(tmp_path, lambda p: os.symlink("/dev/zero", p), caplog)
    assert_fit_ended_normally(callback)
    assert len(warned) == 1, warned
    assert path in warned[0] and "a symbolic link to '/dev/zero'" in warned[0]
    assert "not a regular file" in warned[0]
    assert not os.path.lexists(path), "the link is removed (and only the link)"
    assert os.path.exists("/dev/zero")


@HARD_TIMEOUT
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_as_the_request_is_ignored_with_one_warning_and_the_fit_ends(tmp_path, caplog):
    """Before: opening the FIFO for reading waited for a writer, at the first logging window, for good."""
    callback, path, warned = fit_with_request(tmp_path, os.mkfifo, caplog)
    assert_fit_ended_normally(callback)
    assert len(warned) == 1, warned
    assert path in warned[0] and "a FIFO" in warned[0]
    assert not os.path.lexists(path)


@pytest.mark.timeout(120)
def test_a_folder_under_the_requests_name_is_told_once_over_every_window_of_a_fit(tmp_path, caplog):
    """What cannot be removed stays, and is not warned about again at each window."""
    callback, path, warned = fit_with_request(tmp_path, os.mkdir, caplog)
    assert_fit_ended_normally(callback)
    assert len(warned) == 1, warned
    assert path in warned[0] and "a folder" in warned[0]
    assert os.path.isdir(path)


def test_a_link_to_a_valid_request_is_not_followed(tmp_path, caplog):
    """Even a link to a well-formed request is refused: ``lightning-perf capture`` writes a plain file."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = write_request(str(elsewhere))
    os.symlink(target, tmp_path / REQUEST_FILENAME)
    inbox = RequestInbox(str(tmp_path), started=time.time())
    with caplog.at_level(logging.WARNING, logger="lightning_perf"):
        assert inbox.take() is None
    assert "a symbolic link to" in caplog.text and target in caplog.text
    assert os.path.isfile(target), "the link's target is left alone"
    assert not os.path.lexists(tmp_path / REQUEST_FILENAME)


def test_a_request_past_the_byte_cap_is_refused_and_a_valid_one_is_still_taken(tmp_path, caplog):
    request = json.loads(Path(write_request(str(tmp_path))).read_text())
    padded = json.dumps({**request, "by": "x" * MAX_REQUEST_BYTES}).encode()
    (tmp_path / REQUEST_FILENAME).write_bytes(padded)
    inbox = RequestInbox(str(tmp_path), started=time.time())
    with caplog.at_level(logging.WARNING, logger="lightning_perf"):
        assert inbox.take() is None
    assert f"{len(padded)} bytes is not a capture request" in caplog.text
    write_request(str(tmp_path))
    assert inbox.take() is not None and inbox.take() is None


@pytest.mark.timeout(180)
def test_a_fit_without_logger_writes_beside_the_package_without_shadowing_it(tmp_path, monkeypatch):
    """Before: ``./lightning_perf/version_N`` in the working directory, which an editable install (its import
    finder comes after the working directory) then imported as an empty namespace package: every later run
    from that folder failed with "module 'lightning_perf' has no attribute 'PerfCallback'"."""
    monkeypatch.chdir(tmp_path)
    callback = quiet_callback()
    # no default_root_dir: Lightning's default, the working directory, as in a user's script
    trainer(tmp_path, [callback], default_root_dir=None, logger=False, limit_train_batches=8).fit(
        TinyModel(), loader(n=32)
    )
    assert os.listdir(tmp_path / NO_LOGGER_DIR) == ["version_0"]
    assert callback.last_summary.log_dir == os.path.join(str(tmp_path), NO_LOGGER_DIR, "version_0")
    assert not (tmp_path / "lightning_perf").exists()
    # a fresh interpreter started there, as the user's next run: the installed package, not the folder
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = "import lightning_perf; print(lightning_perf.PerfCallback.__name__, lightning_perf.__file__)"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    name, where = done.stdout.split()
    assert name == "PerfCallback" and not where.startswith(str(tmp_path))
