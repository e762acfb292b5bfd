"""``lightning-perf compare``: put runs side by side (before/after) from their ``perf_summary.json`` files.

Examples::

    lightning-perf compare lightning_logs       # every run below the root, version_2 before version_10
    lightning-perf compare logs/exp/baseline logs/exp/workers4 --png compare.png
    lightning-perf compare lightning_logs --baseline version_0 --fail-if-slower 5 --no-tensorboard   # CI gate

Prints a table (``--format text|markdown|json``) and writes the comparison into TensorBoard as its own run,
``<common log root>/perf_compare`` by default, so it shows beside the runs. Exit codes: 0 fine, 1 a run is
slower than ``--fail-if-slower`` allows, 2 bad input (missing, corrupt or partial summary, bad argument).
matplotlib and torch's SummaryWriter are imported only when a chart or TensorBoard output is written.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import sys
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from lightning_perf.analysis.comparison import (
    Comparison,
    check_summary,
    compare,
    format_value,
    render_markdown,
    render_text,
    to_json,
)
from lightning_perf.analysis.summary import SUMMARY_FILENAME, RunSummary, SummaryError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

HELP = "Compare runs side by side (before/after) from their perf_summary.json files."

EXIT_OK = 0
EXIT_SLOWER = 1
EXIT_ERROR = 2

TENSORBOARD_SUBDIR = "perf_compare"
TEXT_TAG = "perf/comparison"
IMAGE_TAG = "perf/comparison_chart"

# the headline metrics drawn in the bar chart, one panel each (absent ones are left out)
CHART_KEYS = ("step_time_median_ms", "data_wait_pct", "samples_per_sec", "gpu_util_pct")
CHART_PANEL_WIDTH_IN = 3.6
CHART_HEIGHT_IN = 3.8
CHART_DPI = 100
CHART_BASELINE_COLOR = "#7f7f7f"
CHART_RUN_COLOR = "#1f77b4"
# characters of 9 pt text per inch of figure width (about 5 pt per character), to wrap the verdict title
CHART_TITLE_CHARS_PER_INCH = 14


class CompareError(Exception):
    """Bad input for the command; the message names the file or argument. Exit code 2, no traceback."""


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
    parser.add_argument(
        "--format", choices=("text", "markdown", "json"), default="text", help="output format (default: text)"
    )
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
    parser.add_argument(
        "--fail-if-slower",
        metavar="PCT",
        type=_non_negative_percent,
        help="exit with code 1 when any run's median step time is more than PCT percent above the baseline's",
    )
    parser.add_argument(
        "--allow-partial",
        action="store_true",
        help="compare summaries whose runs timed no training steps (shown as n/a) instead of failing",
    )


def _non_negative_percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage >= 0, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a percentage >= 0, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except (CompareError, SummaryError) as err:
        print(f"lightning-perf compare: error: {err}", file=sys.stderr)
        return EXIT_ERROR


def _run(args: argparse.Namespace) -> int:
    runs = find_runs(args.runs)
    baseline = 0
    if args.baseline is not None:
        index = _baseline_index(runs, args.baseline)
        if index is None:  # a path outside the runs given: compare against it too
            runs = find_runs([args.baseline, *args.runs])
            index = 0
        baseline = index
    if len(runs) < 2:
        raise CompareError(f"need at least two runs to compare, found one: {runs[0][1]}")
    summaries = [load_summary(directory, allow_partial=args.allow_partial) for _, directory in runs]
    comparison = compare(summaries, [name for name, _ in runs], baseline=baseline)

    if args.format == "json":
        print(json.dumps(to_json(comparison), indent=2))
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
        return gate(comparison, args.fail_if_slower)
    return EXIT_OK


def gate(comparison: Comparison, limit_pct: float, prog: str = "lightning-perf compare") -> int:
    """The ``--fail-if-slower`` regression gate: exit code 1 when a run is over ``limit_pct`` slower."""
    row = comparison.metric("step_time_median_ms")
    assert row is not None
    untimed = [name for name, value in zip(comparison.run_names, row.values, strict=True) if value is None]
    if untimed:
        # a regression gate must not pass a run it could not measure
        raise CompareError(f"--fail-if-slower: no median step time for {', '.join(untimed)}; cannot judge")
    over = {name: pct for name, pct in comparison.slower_than_baseline.items() if pct > limit_pct}
    for name, pct in over.items():
        print(
            f"{prog}: {name} is {pct:.1f}% slower than {comparison.baseline} "
            f"(median step time), more than --fail-if-slower {limit_pct:g}%",
            file=sys.stderr,
        )
    return EXIT_SLOWER if over else EXIT_OK


# ----------------------------------------------------------------------------------------------- finding runs


def natural_key(text: str) -> list[Any]:
    """Sort key that orders digit runs by value: ``version_2`` before ``version_10``."""
    return [int(part) if part.isdigit() else part.lower() for part in re.split(r"(\d+)", text)]


def _runs_under(path: str) -> list[str]:
    """Run dirs for one command-line path: the run itself, or every dir below a log root holding a summary."""
    if not os.path.exists(path):
        raise CompareError(f"{path}: no such file or directory")
    if os.path.isfile(path):
        if os.path.basename(path) != SUMMARY_FILENAME:
            raise CompareError(f"{path}: not a run directory or a {SUMMARY_FILENAME} file")
        return [os.path.dirname(path) or "."]
    if os.path.exists(os.path.join(path, SUMMARY_FILENAME)):
        return [path]

    def unreadable(err: OSError) -> None:
        raise CompareError(f"{err.filename}: cannot search for runs: {err.strerror}")

    found = [d for d, _, files in os.walk(path, onerror=unreadable) if SUMMARY_FILENAME in files]
    if not found:
        raise CompareError(
            f"{path}: no {SUMMARY_FILENAME} in this directory or below it "
            "(give a run's log dir or a log root holding runs)"
        )
    return sorted(found, key=lambda d: natural_key(os.path.relpath(d, path).replace(os.sep, "/")))


def common_root(directories: Sequence[str]) -> str:
    """The deepest directory holding all ``directories``."""
    return os.path.commonpath([os.path.abspath(d) for d in directories])


def run_names(directories: Sequence[str]) -> list[str]:
    """Each run's path relative to the runs' common root, e.g. ``version_0`` or ``baseline``."""
    root = common_root(directories)
    names = []
    for directory in directories:
        absolute = os.path.abspath(directory)
        relative = os.path.relpath(absolute, root)
        names.append(os.path.basename(absolute) if relative == "." else relative.replace(os.sep, "/"))
    if len(set(names)) != len(names):  # e.g. a root that is itself a run and holds one of the same name
        names = [os.path.abspath(d) for d in directories]
    return names


def find_runs(paths: Sequence[str]) -> list[tuple[str, str]]:
    """``(name, run_dir)`` for every run the paths name, in order; a dir reached twice counts once."""
    directories: list[str] = []
    seen: set[str] = set()
    for path in paths:
        for directory in _runs_under(path):
            key = os.path.realpath(directory)
            if key not in seen:
                seen.add(key)
                directories.append(directory)
    return list(zip(run_names(directories), directories, strict=True))


def _baseline_index(runs: list[tuple[str, str]], baseline: str) -> int | None:
    """Index of the run ``baseline`` names (by name, then by path); None for a run path not among ``runs``."""
    names = [name for name, _ in runs]
    if baseline in names:
        return names.index(baseline)
    if os.path.exists(baseline):
        targets = _runs_under(baseline)
        if len(targets) != 1:
            raise CompareError(f"--baseline {baseline}: holds {len(targets)} runs, expected one")
        target = os.path.realpath(targets[0])
        for i, (_, directory) in enumerate(runs):
            if os.path.realpath(directory) == target:
                return i
        return None
    raise CompareError(f"--baseline {baseline!r}: no run has that name or path; runs: {', '.join(names)}")


def load_summary(directory: str, allow_partial: bool = False) -> RunSummary:
    """Load and check one run's summary; errors name the file."""
    path = os.path.join(directory, SUMMARY_FILENAME)
    summary = RunSummary.load(path)
    try:
        check_summary(summary)
    except ValueError as err:
        raise CompareError(f"{path}: malformed run summary: {err}") from None
    if summary.timing.steps == 0 and not allow_partial:
        raise CompareError(
            f"{path}: partial run summary: no training steps were timed (status {summary.status!r}); "
            "pass --allow-partial to compare it anyway"
        )
    return summary


# ----------------------------------------------------------------------------------------------- outputs


def chart_figure(comparison: Comparison) -> Figure:
    """A bar chart of the headline metrics per run, one panel per metric, drawn with Agg (no pyplot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = [row for key in CHART_KEYS if (row := comparison.metric(key)) is not None]
    figure = Figure(figsize=(CHART_PANEL_WIDTH_IN * len(rows), CHART_HEIGHT_IN), dpi=CHART_DPI)
    FigureCanvasAgg(figure)
    figure.set_layout_engine("constrained")
    base = comparison.baseline_index
    names = [f"{name}\n(baseline)" if i == base else name for i, name in enumerate(comparison.run_names)]
    colors = [CHART_BASELINE_COLOR if i == base else CHART_RUN_COLOR for i in range(len(names))]
    rotate = sum(len(name) for name in comparison.run_names) > 30  # long names overlap when set horizontally
    for axes, row in zip(figure.subplots(1, len(rows), squeeze=False)[0], rows, strict=True):
        # an absent value gets no bar and an "n/a" label, never a bar at 0
        heights = [value if value is not None else 0.0 for value in row.values]
        bars = axes.bar(range(len(names)), heights, color=colors)
        axes.bar_label(bars, labels=[format_value(v, row.unit) for v in row.values], fontsize=8)
        judged = f", {row.better} is better" if row.better else ""
        axes.set_title(f"{row.label} ({row.unit}{judged})", fontsize=9)
        axes.set_xticks(
            range(len(names)), names, rotation=30 if rotate else 0, ha="right" if rotate else "center"
        )
        axes.margins(y=0.15)
    title_width = int(CHART_PANEL_WIDTH_IN * len(rows) * CHART_TITLE_CHARS_PER_INCH)
    figure.suptitle(textwrap.fill(comparison.verdict, title_width), fontsize=9)
    return figure


def write_png(comparison: Comparison, path: str) -> None:
    """Write :func:`chart_figure` as a PNG file."""
    try:
        chart_figure(comparison).savefig(path, format="png")
    except OSError as err:
        raise CompareError(f"--png {path}: cannot write the chart: {err.strerror or err}") from None


def _chart_rgb(comparison: Comparison) -> Any:
    import numpy as np

    figure = chart_figure(comparison)
    figure.canvas.draw()
    return np.asarray(figure.canvas.buffer_rgba())[..., :3].copy()


def write_tensorboard(comparison: Comparison, directory: str) -> None:
    """Write the comparison (markdown text and chart image) into ``directory`` as its own TensorBoard run.

    Each call adds a new step (one more than the event files already there), so rerunning the comparison
    keeps the history and TensorBoard shows the latest by default.
    """
    from torch.utils.tensorboard import SummaryWriter

    step = len(glob.glob(os.path.join(glob.escape(directory), "events.out.tfevents.*")))
    try:
        writer = SummaryWriter(log_dir=directory)
    except OSError as err:
        raise CompareError(
            f"{directory}: cannot write TensorBoard output: {err.strerror or err} "
            "(choose another with --tensorboard-dir or skip with --no-tensorboard)"
        ) from None
    try:
        writer.add_text(TEXT_TAG, render_markdown(comparison), global_step=step)
        writer.add_image(IMAGE_TAG, _chart_rgb(comparison), global_step=step, dataformats="HWC")
    finally:
        writer.close()
