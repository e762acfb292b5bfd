"""``lightning-perf compare``: put runs side by side (before/after) from their ``perf_summary.json`` files.

Examples::

    lightning-perf compare lightning_logs       # every run below the root, version_2 before version_10
    lightning-perf compare logs/exp/baseline logs/exp/workers4 --png compare.png
    lightning-perf compare lightning_logs --baseline version_0 --fail-if-slower 5 --no-tensorboard   # CI gate
    lightning-perf compare logs/v0 logs/v1 --label before --label after   # or --label-from-settings

Prints a table (``--format text|markdown|json``) and writes the comparison into TensorBoard as its own run,
``<common log root>/perf_compare`` by default, so it shows beside the runs. Exit codes: 0 fine, 1 a run is
significantly slower than ``--fail-if-slower`` allows, 2 bad input (missing, corrupt or partial summary, bad argument).
matplotlib and torch's SummaryWriter are imported only when a chart or TensorBoard output is written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from lightning_perf.analysis.run_discovery import (
    baseline_index,
    common_root,
    find_runs,
    load_hparams,
    load_summary,
)
from lightning_perf.analysis.summary import SUMMARY_FILENAME
from lightning_perf.analysis.verdicts.comparison import CompareError, compare
from lightning_perf.analysis.verdicts.comparison_metrics import labels_from_settings
from lightning_perf.analysis.verdicts.comparison_render import render_markdown, render_text, to_json
from lightning_perf.cli.common import EXIT_OK, add_fail_if_slower, add_format, gate, guard
from lightning_perf.output.comparison_chart import TENSORBOARD_SUBDIR, write_png, write_tensorboard

HELP = "Compare runs side by side (before/after) from their perf_summary.json files."
PROG = "lightning-perf compare"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "runs",
        nargs="+",
        metavar="RUN_DIR",
        help=f"a run's log dir (holding {SUMMARY_FILENAME}), the file itself, or a log root whose runs are "
        "found below it; the first run is the baseline",
    )
    parser.add_argument(
        "--baseline",
        metavar="NAME|PATH",
        help="the run to compare against, by name (as printed) or path (default: the first run)",
    )
    add_format(parser)
    parser.add_argument("--png", metavar="FILE", help="also write a bar chart of the headline metrics")
    tensorboard = parser.add_mutually_exclusive_group()
    tensorboard.add_argument(
        "--no-tensorboard", action="store_true", help="do not write the comparison into TensorBoard"
    )
    tensorboard.add_argument(
        "--tensorboard-dir",
        metavar="DIR",
        help=f"TensorBoard run dir for the comparison (default: <common log root>/{TENSORBOARD_SUBDIR})",
    )
    add_fail_if_slower(parser)
    labels = parser.add_mutually_exclusive_group()
    labels.add_argument(
        "--label",
        action="append",
        metavar="NAME",
        help="a label for each run in the order found (repeat once per run), shown instead of its directory",
    )
    labels.add_argument(
        "--label-from-settings",
        action="store_true",
        help="label each run by the settings that differ, e.g. num_workers=4 (its directory where none do)",
    )
    parser.add_argument(
        "--allow-partial",
        action="store_true",
        help="compare summaries whose runs timed no training steps (shown as n/a) instead of failing",
    )


def run(args: argparse.Namespace) -> int:
    # CompareError, SummaryError; OSError: an unreadable dir, an unwritable output
    return guard(PROG, lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    runs = find_runs(args.runs)
    baseline = 0
    if args.baseline is not None:
        index = baseline_index(runs, args.baseline)
        if index is None:  # a path outside the runs given: compare against it too
            runs = find_runs([args.baseline, *args.runs])
            index = 0
        baseline = index
    if len(runs) < 2:
        raise CompareError(f"need at least two runs to compare, found one: {runs[0][1]}")
    summaries = [load_summary(directory, allow_partial=args.allow_partial) for _, directory in runs]
    names = [name for name, _ in runs]
    if args.label:
        if len(args.label) != len(runs):
            raise CompareError(
                f"--label: given {len(args.label)} labels for {len(runs)} runs ({', '.join(names)}); give one "
                "per run, in that order"
            )
        if len(set(args.label)) != len(args.label):
            raise CompareError(f"--label: labels must be unique, got {args.label}")
        names = list(args.label)
    elif args.label_from_settings:
        names = labels_from_settings(summaries, names)
    hparams = [load_hparams(directory) for _, directory in runs]
    comparison = compare(summaries, names, baseline=baseline, hparams=hparams)

    if args.format == "json":
        print(json.dumps(to_json(comparison), indent=2, allow_nan=False))
    elif args.format == "markdown":
        print(render_markdown(comparison), end="")
    else:
        print(render_text(comparison), end="")

    if args.png:
        write_png(comparison, args.png)
        print(f"lightning-perf compare: wrote chart {args.png}", file=sys.stderr)
    if not args.no_tensorboard:
        directory = args.tensorboard_dir or os.path.join(
            common_root([d for _, d in runs]), TENSORBOARD_SUBDIR
        )
        write_tensorboard(comparison, directory)
        print(f"lightning-perf compare: wrote TensorBoard run {directory}", file=sys.stderr)

    if args.fail_if_slower is not None:
        return gate(comparison, args.fail_if_slower, PROG)
    return EXIT_OK
