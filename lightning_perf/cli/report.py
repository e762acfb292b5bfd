"""``lightning-perf report RUN_DIR``: what a run's profiler traces and diagnosis say, in one page."""

from __future__ import annotations

import argparse
import sys

from lightning_perf.analysis.rules.cross_rank import rank_list
from lightning_perf.cli.common import EXIT_FAILED, EXIT_OK, add_format, error, guard
from lightning_perf.traces.figures.breakdown import ALIGNMENTS, TB_ALIGNMENT
from lightning_perf.traces.read.allocator import keep_freed_memory
from lightning_perf.traces.report.build import DEFAULT_TOP, ReportError, build_report
from lightning_perf.traces.report.ranks import detailed_ranks
from lightning_perf.traces.report.render import render_json, render_markdown, render_text
from lightning_perf.traces.report.runs import run_reports

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
        "--rank",
        dest="ranks",
        type=_rank,
        action="append",
        metavar="N",
        help="with many ranks (over 4), also detail rank N's traces (repeatable; default: the ranks that stand "
        "out: slowest, fastest, median)",
    )
    parser.add_argument("--all-ranks", action="store_true", help="detail every rank's traces")
    parser.add_argument(
        "--top",
        type=_positive_int("--top"),
        default=DEFAULT_TOP,
        metavar="N",
        help="operators to list (default: 10)",
    )
    parser.add_argument(
        "--alignment",
        choices=ALIGNMENTS,
        default=TB_ALIGNMENT,
        help="how kernels are assigned to steps: torch-tb-profiler's time cut (default: the figures equal the "
        "plugin's; a step starts no earlier than the previous step's kernels end) or launch (each kernel in the "
        "step that launched it; CPU spans such as a DataLoader call stay in their step; steps may overlap)",
    )
    parser.add_argument(
        "--jobs",
        type=_positive_int("--jobs"),
        default=None,
        metavar="N",
        help="traces read at once, one process each (default and at most: the usable CPU cores, and no more "
        "than there are traces; 1: no extra process)",
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


def _rank(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--rank must be a global rank (an integer >= 0), got {text!r}"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"--rank must be a global rank (an integer >= 0), got {value}")
    return value


def _missing_ranks(report: dict, chosen: list[int] | None) -> ReportError | None:
    present = {t["rank"] for t in report["traces"] if t["rank"] is not None}
    missing = sorted(set(chosen or []) - present)
    if not missing:
        return None
    have = rank_list(present) if present else "none"
    shown = ", ".join(str(r) for r in missing)
    return ReportError(
        f"--rank {shown}: no trace of that rank in {report['run_dir']} (ranks with traces: {have})"
    )


def run(args: argparse.Namespace) -> int:
    # ReportError, TraceError, SummaryError; OSError: an unreadable dir or file
    return guard(PROG, lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    keep_freed_memory()  # this process is ours: with --jobs 1 it reads the traces one after another itself
    notices: list[str] = []
    report = build_report(
        args.run_dir, top=args.top, jobs=args.jobs, notices=notices, alignment=args.alignment
    )
    for notice in notices:  # how it ran, not what the traces say: the report is the same whatever --jobs
        jobs = "" if args.jobs is None else f" --jobs {args.jobs}:"  # not given: no Python None in the line
        print(f"{PROG}: note:{jobs} {notice}", file=sys.stderr)
    bad_rank = _missing_ranks(report, args.ranks)
    if bad_rank is not None:
        return error(PROG, bad_rank)
    detail = detailed_ranks(report, args.ranks, args.all_ranks)
    if args.png and report["traces"]:
        from lightning_perf.output.trace_chart import write_png

        sections = [
            (t["file"] + ("" if t["rank"] is None else f" (rank {t['rank']})"), t["figures"])
            for t in report["traces"]
            if detail is None or t["rank"] is None or t["rank"] in detail
        ]
        try:
            write_png(sections, args.png)
        except OSError as err:
            return error(
                PROG, ReportError(f"--png {args.png}: cannot write the chart: {err.strerror or err}")
            )
    if args.format == "json":
        sys.stdout.write(render_json(report, detail))
    else:  # a folder mixing runs: one report a run, each with its own cross-rank view
        render = render_text if args.format == "text" else render_markdown
        parts = run_reports(report)
        for index, part in enumerate(parts):
            part_detail = detail if len(parts) == 1 else detailed_ranks(part, args.ranks, args.all_ranks)
            sys.stdout.write(("\n" if index else "") + render(part, part_detail))
    for bad in report["unreadable"]:
        print(f"{PROG}: unreadable: {bad['error']}", file=sys.stderr)
    return EXIT_FAILED if report["unreadable"] else EXIT_OK
