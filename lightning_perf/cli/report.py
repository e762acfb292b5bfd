"""``lightning-perf report RUN_DIR``: what a run's profiler traces and diagnosis say, in one page."""

from __future__ import annotations

import argparse
import sys

from lightning_perf.analysis.summary import SummaryError
from lightning_perf.cli.common import EXIT_FAILED, EXIT_OK, add_format, error
from lightning_perf.traces.reader import TraceError
from lightning_perf.traces.report import (
    DEFAULT_TOP,
    ReportError,
    build_report,
    render_json,
    render_markdown,
    render_text,
)

HELP = "Report a run's profiler traces: step time breakdown, top operators, GPU kernel-busy share, findings."
PROG = "lightning-perf report"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run's log dir (traces and perf_summary.json)")
    add_format(parser)
    parser.add_argument(
        "--top", type=_positive_int, default=DEFAULT_TOP, metavar="N", help="operators to list (default: 10)"
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--top must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"--top must be a positive integer, got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    try:
        report = build_report(args.run_dir, top=args.top)
    except (ReportError, TraceError, SummaryError, OSError) as err:  # OSError: unreadable dir or file
        return error(PROG, err)
    renderers = {"text": render_text, "markdown": render_markdown, "json": render_json}
    sys.stdout.write(renderers[args.format](report))
    for bad in report["unreadable"]:
        print(f"{PROG}: unreadable: {bad['error']}", file=sys.stderr)
    return EXIT_FAILED if report["unreadable"] else EXIT_OK
