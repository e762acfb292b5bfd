"""``lightning-perf report RUN_DIR``: what a run's profiler traces and diagnosis say, in one page."""

from __future__ import annotations

import argparse
import sys

from lightning_perf.analysis.summary import SummaryError
from lightning_perf.cli.common import EXIT_FAILED, EXIT_OK, add_format, error
from lightning_perf.traces.reader import TraceError
from lightning_perf.traces.report import DEFAULT_TOP, ReportError, build_report
from lightning_perf.traces.report_render import render_json, render_markdown, render_text

HELP = (
    "Report profiler traces (a run dir, any folder or one trace file): step breakdown, GPU timeline, blocking "
    "calls, copies, tensor cores, memory, findings."
)
PROG = "lightning-perf report"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir",
        metavar="PATH",
        help="a run's log dir (traces and perf_summary.json), any folder of Chrome/Kineto traces, or one trace",
    )
    add_format(parser)
    parser.add_argument(
        "--png", metavar="FILE", help="also write the per-step breakdown and GPU timeline shares as a PNG"
    )
    parser.add_argument(
        "--top",
        type=_positive_int("--top"),
        default=DEFAULT_TOP,
        metavar="N",
        help="operators to list (default: 10)",
    )
    parser.add_argument(
        "--jobs",
        type=_positive_int("--jobs"),
        default=None,
        metavar="N",
        help="traces read at once, one process each (default: the usable CPU cores; 1: no extra process)",
    )


def _positive_int(flag: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be a positive integer, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{flag} must be a positive integer, got {value}")
        return value

    return parse


def run(args: argparse.Namespace) -> int:
    try:
        report = build_report(args.run_dir, top=args.top, jobs=args.jobs)
    except (ReportError, TraceError, SummaryError, OSError) as err:  # OSError: unreadable dir or file
        return error(PROG, err)
    if args.png and report["traces"]:
        from lightning_perf.output.trace_chart import write_png

        sections = [
            (t["file"] + ("" if t["rank"] is None else f" (rank {t['rank']})"), t["figures"])
            for t in report["traces"]
        ]
        try:
            write_png(sections, args.png)
        except OSError as err:
            return error(
                PROG, ReportError(f"--png {args.png}: cannot write the chart: {err.strerror or err}")
            )
    renderers = {"text": render_text, "markdown": render_markdown, "json": render_json}
    sys.stdout.write(renderers[args.format](report))
    for bad in report["unreadable"]:
        print(f"{PROG}: unreadable: {bad['error']}", file=sys.stderr)
    return EXIT_FAILED if report["unreadable"] else EXIT_OK
