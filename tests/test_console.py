"""One way to tell the user things: the ``lightning_perf`` logger, propagating, rank-zero aware, bar-aware."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys

from tqdm import tqdm

from lightning_perf import PerfCallback, console
from tests.helpers import TinyModel, loader, trainer

log = console.logger("lightning_perf.tests")


def plain_script(monkeypatch) -> io.StringIO:
    """The logging set-up of a plain script: no handler anywhere. Called in the test body: pytest adds its
    own handler to the root logger for the call phase, after fixtures ran."""
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    return stderr


def test_records_propagate_to_the_users_handlers_and_ours_stays_silent(caplog, capsys):
    with caplog.at_level(logging.INFO):
        log.info("lightning-perf: hello")
    assert [r.getMessage() for r in caplog.records] == ["lightning-perf: hello"]
    assert logging.getLogger("lightning_perf").propagate
    assert "hello" not in capsys.readouterr().err  # printed once, by the user's handler


def test_info_lines_show_by_default_between_progress_bar_redraws(monkeypatch):
    no_user_logging = plain_script(monkeypatch)
    bar = tqdm(total=10, file=no_user_logging, ascii=True)
    bar.update(3)
    log.info("lightning-perf: a line of ours")
    bar.close()
    text = no_user_logging.getvalue()
    # tqdm.write cleared the bar (a carriage return) before the line: nothing of the bar sits in front of it
    before, _, after = text.partition("lightning-perf: a line of ours\n")
    assert after and before.endswith("\r")
    assert "3/10" in after  # and drew the bar again


def test_the_user_silences_us_as_any_logger(monkeypatch):
    no_user_logging = plain_script(monkeypatch)
    ours = logging.getLogger("lightning_perf")
    level = ours.level
    ours.setLevel(logging.WARNING)  # what a user writes to silence the info lines
    try:
        log.info("lightning-perf: quiet")
        log.warning("lightning-perf: loud")
    finally:
        ours.setLevel(level)
    assert no_user_logging.getvalue() == "lightning-perf: loud\n"


def test_other_ranks_stay_quiet_unless_asked(monkeypatch):
    no_user_logging = plain_script(monkeypatch)
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    monkeypatch.setattr(rank_zero_only, "rank", 1, raising=False)
    log.warning("lightning-perf: from rank 1")
    log.warning("lightning-perf: this rank's own trouble", extra={"all_ranks": True})
    assert no_user_logging.getvalue() == "lightning-perf: this rank's own trouble\n"


def test_kineto_console_lines_are_off_on_cpu_unless_the_user_set_the_level():
    code = (
        "import torch\n"
        "from lightning_perf.console import quiet_kineto\n"
        "quiet_kineto(torch.cuda.is_available())\n"
        "with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):\n"
        "    torch.ones(4) @ torch.ones(4)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != console.KINETO_LOG_LEVEL_ENV}
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert quiet.returncode == 0, quiet.stderr
    assert "USDT" not in quiet.stderr and "gpuGetDeviceCount" not in quiet.stderr
    env[console.KINETO_LOG_LEVEL_ENV] = "0"  # the user's choice wins
    chatty = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert "profiler_start" in chatty.stderr


def test_the_callback_quiets_kineto_before_its_first_profiler(tmp_path, monkeypatch):
    monkeypatch.setenv(console.KINETO_LOG_LEVEL_ENV, "unset")
    monkeypatch.delenv(console.KINETO_LOG_LEVEL_ENV)  # restored (absent) after the test
    callback = PerfCallback(skip_first=0, wait=0, warmup=1, active=1, utilization=False, diagnose=False)
    trainer(tmp_path, [callback], limit_train_batches=3).fit(TinyModel(), loader())
    assert os.environ[console.KINETO_LOG_LEVEL_ENV] == console.KINETO_QUIET_LEVEL  # no CUDA here
