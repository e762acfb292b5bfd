"""The comparison as pictures: a PNG bar chart and its own TensorBoard run (text and image).

matplotlib and torch's SummaryWriter are imported only when a chart or TensorBoard output is written.
"""

from __future__ import annotations

import glob
import os
import textwrap
from typing import TYPE_CHECKING, Any

from lightning_perf.analysis.markdown import for_text_tab
from lightning_perf.analysis.metrics import COMPARISON_CHART, COMPARISON_TEXT
from lightning_perf.analysis.verdicts.comparison import CompareError, Comparison, MetricRow, format_value
from lightning_perf.analysis.verdicts.comparison_render import change_cell, render_markdown
from lightning_perf.atomic_file import atomic_path, describe_os_error

if TYPE_CHECKING:
    from matplotlib.figure import Figure

TENSORBOARD_SUBDIR = "perf_compare"
# in the registry's sections, beside a run's own text and images (perf_text/..., perf_images/...)
TEXT_TAG = COMPARISON_TEXT.tag
IMAGE_TAG = COMPARISON_CHART.tag

# the headline metrics drawn in the bar chart, one panel each (absent ones are left out)
CHART_KEYS = ("step_time_mean_ms", "data_wait_pct", "samples_per_sec", "gpu_util_pct")
CHART_PANEL_WIDTH_IN = 3.6
CHART_HEIGHT_IN = 3.8
CHART_DPI = 100
CHART_BASELINE_COLOR = "#7f7f7f"
CHART_RUN_COLOR = "#1f77b4"
# characters of 9 pt text per inch of figure width (about 5 pt per character), to wrap the verdict title
CHART_TITLE_CHARS_PER_INCH = 14
# characters of a change's line under a bar (8 pt)
CHART_TICK_CHARS = 26


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
        bars = axes.bar(range(len(names)), heights, color=colors, yerr=_error_bars(row, heights), capsize=4)
        axes.bar_label(bars, labels=[format_value(v, row.unit) for v in row.values], fontsize=8)
        judged = f", {row.better} is better" if row.better else ""
        axes.set_title(f"{row.label} ({row.unit}{judged})", fontsize=9)
        axes.set_xticks(
            range(len(names)),
            _tick_labels(names, row),
            rotation=30 if rotate else 0,
            ha="right" if rotate else "center",
            fontsize=8,
        )
        axes.margins(y=0.15)
    title_width = int(CHART_PANEL_WIDTH_IN * len(rows) * CHART_TITLE_CHARS_PER_INCH)
    figure.suptitle(textwrap.fill(comparison.verdict, title_width), fontsize=9)
    return figure


def _tick_labels(names: list[str], row: MetricRow) -> list[str]:
    """Each run's name and, under it, its change against the baseline as the tables say it, in one direction
    (``2.30x faster, 2.10-2.52x``), wrapped to the bar's width."""
    labels = []
    for i, name in enumerate(names):
        change = row.changes[i] if i < len(row.changes) else None
        note = (
            "" if change is None else "\n" + textwrap.fill(change_cell(change, row.better), CHART_TICK_CHARS)
        )
        labels.append(name + note)
    return labels


def _error_bars(row: MetricRow, heights: list[float]) -> list[list[float]] | None:
    """The 95% interval of each bar as matplotlib's (below, above) distances; None where no run has one."""
    if not any(row.intervals):
        return None
    below, above = [], []
    for height, interval in zip(heights, row.intervals or [None] * len(heights), strict=True):
        low, high = interval if interval is not None else (height, height)
        below.append(max(0.0, height - low))
        above.append(max(0.0, high - height))
    return [below, above]


def write_png(comparison: Comparison, path: str) -> None:
    """Write :func:`chart_figure` as a PNG file."""
    try:
        with atomic_path(path) as tmp:
            chart_figure(comparison).savefig(tmp, format="png")
    except OSError as err:
        raise CompareError(f"--png {path}: cannot write the chart: {describe_os_error(err)}") from None


def _chart_rgb(comparison: Comparison) -> Any:
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(chart_figure(comparison))  # Agg: renders into memory
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def write_tensorboard(comparison: Comparison, directory: str) -> None:
    """Write the comparison (markdown text and chart image) into ``directory`` as its own TensorBoard run.

    Rerunning replaces the run: the event files an earlier comparison wrote there (only ours: a file holding any
    other tag, a user's run, is never touched) are removed first, so TensorBoard shows one comparison.
    """
    from torch.utils.tensorboard import SummaryWriter

    for path in glob.glob(os.path.join(glob.escape(directory), "events.out.tfevents.*")):
        if _written_by_compare(path):
            try:
                os.remove(path)
            except OSError as err:
                raise CompareError(
                    f"{path}: cannot replace the earlier comparison: {describe_os_error(err)}"
                ) from None
    try:
        writer = SummaryWriter(log_dir=directory)
    except OSError as err:
        raise CompareError(
            f"{directory}: cannot write TensorBoard output: {err.strerror or err} "
            "(choose another with --tensorboard-dir or skip with --no-tensorboard)"
        ) from None
    try:
        writer.add_text(TEXT_TAG, for_text_tab(render_markdown(comparison)), global_step=0)
        writer.add_image(IMAGE_TAG, _chart_rgb(comparison), global_step=0, dataformats="HWC")
    finally:
        writer.close()


def _written_by_compare(path: str) -> bool:
    """Whether the event file at ``path`` holds the comparison's text and image and nothing else."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    ours = (TEXT_TAG, IMAGE_TAG)
    tags = []
    try:
        for event in EventFileLoader(path).Load():
            if event.HasField("summary"):
                tags += [value.tag for value in event.summary.value]
            elif not event.HasField("file_version"):
                return False
    except Exception:  # unreadable or truncated: not known to be ours
        return False
    return bool(tags) and all(tag.startswith(ours) for tag in tags)
