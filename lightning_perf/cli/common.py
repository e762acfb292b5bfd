"""What every command shares: exit codes, the ``--format`` and ``--fail-if-slower`` options, error lines."""

from __future__ import annotations

import argparse
import math
import sys

from lightning_perf.analysis.verdicts.comparison import Comparison
from lightning_perf.analysis.verdicts.regression_gate import gate_lines, regressions
from lightning_perf.atomic_file import describe_os_error

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


def gate(comparison: Comparison, limit_pct: float, prog: str) -> int:
    """The ``--fail-if-slower`` regression gate: exit code 1 when a run is significantly over ``limit_pct`` slower.

    Every run over the limit gets one line saying whether it fails and why (its interval, or none).
    """
    over = regressions(comparison, limit_pct)
    for line in gate_lines(comparison, limit_pct):
        print(f"{prog}: {line}", file=sys.stderr)
    return EXIT_FAILED if over else EXIT_OK
