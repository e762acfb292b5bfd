"""What every command shares: exit codes, the ``--format`` and ``--fail-if-slower`` options, error lines, and
:func:`guard`, how every command ends when stopped or refused."""

from __future__ import annotations

import argparse
import glob
import math
import os
import sys
from collections.abc import Callable

from lightning_perf.analysis.summary import SUMMARY_FILENAME
from lightning_perf.analysis.verdicts.comparison import Comparison
from lightning_perf.analysis.verdicts.regression_gate import gate_lines, regressions
from lightning_perf.atomic_file import describe_os_error
from lightning_perf.errors import LightningPerfError
from lightning_perf.trial.round_signals import Terminated

EXIT_OK = 0
EXIT_FAILED = 1  # a regression, a failed variant, some unreadable traces
EXIT_ERROR = 2  # bad arguments or input
EXIT_INTERRUPTED = 130  # the shell's code for a command stopped by Ctrl-C (128 + SIGINT)
FORMATS = ("text", "markdown", "json")


def add_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=FORMATS, default="text", help="output format (default: text)")


def non_negative_percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage >= 0, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a percentage >= 0, got {text!r}")
    return value


def add_fail_if_slower(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fail-if-slower",
        metavar="PCT",
        type=non_negative_percent,
        help="exit with code 1 when a run's mean step time is more than PCT percent above the baseline's "
        "and the slowdown is significant (its interval lies above 1); a larger slowdown that noise could "
        "explain is reported and passes",
    )


def error(prog: str, err: BaseException, code: int = EXIT_ERROR) -> int:
    """One error line on stderr, no traceback; returns the exit code. An OSError names its path and errno."""
    if isinstance(err, OSError):
        where = f"{err.filename}: " if err.filename else ""
        err = f"{where}{describe_os_error(err)}"  # type: ignore[assignment]
    print(f"{prog}: error: {err}", file=sys.stderr)
    return code


def guard(prog: str, body: Callable[[], int], kept: Callable[[], str] | None = None) -> int:
    """Run a command's ``body`` and return its exit code; every way it ends early says one line on stderr, no
    traceback: Ctrl-C ``PROG: interrupted`` (130), SIGTERM or SIGHUP ``PROG: terminated`` (128 + the signal; the
    running worker's process group was stopped first), each followed by ``kept()`` (what stays on disk) where
    given; one of the project's errors or an OSError ``PROG: error: ...`` (2, an OSError naming its path)."""
    try:
        return body()
    except KeyboardInterrupt:
        return _stopped(prog, "interrupted", EXIT_INTERRUPTED, kept)
    except Terminated as stop:  # a SystemExit: raised by the trial's signal handlers during a round
        return _stopped(prog, "terminated", 128 + stop.signum, kept)
    except (LightningPerfError, OSError) as err:
        return error(prog, err)


def runs_kept(log_dir: str) -> str:
    """What a stopped trial or tune leaves: the runs done, counted by their summaries under ``log_dir``."""
    done = glob.glob(os.path.join(glob.escape(log_dir), "**", SUMMARY_FILENAME), recursive=True)
    return f"the runs done are kept ({len(done)} run summaries under {log_dir})"


def _stopped(prog: str, how: str, code: int, kept: Callable[[], str] | None) -> int:
    print(f"{prog}: {how}" + (f"; {kept()}" if kept is not None else ""), file=sys.stderr)
    return code


def gate(comparison: Comparison, limit_pct: float, prog: str) -> int:
    """The ``--fail-if-slower`` regression gate: exit code 1 when a run is significantly over ``limit_pct`` slower.

    Every run over the limit gets one line saying whether it fails and why (its interval, or none).
    """
    over = regressions(comparison, limit_pct)
    for line in gate_lines(comparison, limit_pct):
        print(f"{prog}: {line}", file=sys.stderr)
    return EXIT_FAILED if over else EXIT_OK
