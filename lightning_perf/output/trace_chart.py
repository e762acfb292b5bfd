"""The traces as a picture: the per-step breakdown (stacked bars) and the GPU timeline shares, one row per trace.

Input: ``(label, figures)`` pairs where ``figures`` is a :class:`~lightning_perf.analysis.trace_figures.TraceFigures`
as a dict (``dataclasses.asdict``, or the ``figures`` of a report section). matplotlib is imported only when a
chart is drawn, with the Agg canvas (no pyplot, no display).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# the Overview categories (traces.breakdown.CATEGORIES) with their labels and colors, bottom to top
CATEGORY_STYLE = (
    ("dataloader", "DataLoader", "#d62728"),
    ("cpu_exec", "CPU Exec", "#ff7f0e"),
    ("kernel", "Kernel", "#2ca02c"),
    ("memcpy", "Memcpy", "#1f77b4"),
    ("memset", "Memset", "#17becf"),
    ("communication", "Communication", "#9467bd"),
    ("runtime", "Runtime", "#8c564b"),
    ("other", "Other", "#7f7f7f"),
)
TIMELINE_STYLE = (
    ("compute_pct", "compute", "#2ca02c"),
    ("non_compute_pct", "non-compute", "#9467bd"),
    ("idle_pct", "idle", "#d3d3d3"),
)
ROW_HEIGHT_IN = 2.8
WIDTH_IN = 11.0
DPI = 100


def chart_figure(sections: Sequence[tuple[str, dict[str, Any]]]) -> Figure:
    """One row per trace: its steps as stacked bars (ms), and HTA's GPU timeline shares as one bar (%); the
    GPU column only when some trace had GPU activity (a CPU run's chart is its steps alone, not half empty)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = max(len(sections), 1)
    gpu = any(figures.get("idle_pct") is not None for _, figures in sections)
    figure = Figure(figsize=(WIDTH_IN, ROW_HEIGHT_IN * rows), dpi=DPI)
    FigureCanvasAgg(figure)
    figure.set_layout_engine("constrained")
    grid = figure.subplots(rows, 2 if gpu else 1, squeeze=False, width_ratios=[3, 1] if gpu else None)
    for axes, (label, figures) in zip(grid, sections, strict=False):
        _steps(axes[0], label, figures)
        if gpu:
            _timeline(axes[1], figures)
    return figure


def _steps(axes: Any, label: str, figures: dict[str, Any]) -> None:
    steps = figures.get("steps_ms") or []
    bottoms = [0.0] * len(steps)
    for key, name, color in CATEGORY_STYLE:
        heights = [step.get(key, 0.0) for step in steps]
        if any(heights):
            axes.bar(range(len(steps)), heights, bottom=bottoms, color=color, label=name)
            bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    labels = step_labels(figures)
    covered = (
        f"profiled steps {labels[0]}-{labels[-1]}" if len(labels) > 1 else f"profiled step {''.join(labels)}"
    )
    axes.set_title(f"{label}: step breakdown (ms), {covered}", fontsize=9)
    axes.set_xticks(range(len(steps)), labels)
    axes.set_xlabel("profiled step", fontsize=8)
    if steps:
        axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def step_labels(figures: dict[str, Any]) -> list[str]:
    """The x labels of the step bars: each step's own number (ProfilerStep#N, as the report's text and
    TensorBoard number it), else its place among the profiled steps (1, 2, ...)."""
    count = len(figures.get("steps_ms") or [])
    numbers = figures.get("step_numbers") or []
    if len(numbers) == count and all(isinstance(n, int) for n in numbers):
        return [str(n) for n in numbers]
    return [str(i + 1) for i in range(count)]


def _timeline(axes: Any, figures: dict[str, Any]) -> None:
    axes.set_title("GPU timeline (%)", fontsize=9)
    axes.set_ylim(0, 100)
    axes.set_xticks([])
    if figures.get("idle_pct") is None:
        axes.text(0.5, 50, "no GPU activity", ha="center", va="center", fontsize=8)
        return
    bottom = 0.0
    for key, name, color in TIMELINE_STYLE:
        value = figures[key]
        axes.bar([0.5], [value], bottom=bottom, color=color, width=0.6)
        if value >= 4:  # a label fits
            axes.text(0.5, bottom + value / 2, f"{name} {value:.1f}%", ha="center", va="center", fontsize=7)
        bottom += value
    axes.set_xlim(0, 1)


def write_png(sections: Sequence[tuple[str, dict[str, Any]]], path: str) -> None:
    chart_figure(sections).savefig(path, format="png")


def chart_rgb(sections: Sequence[tuple[str, dict[str, Any]]]) -> Any:
    """The chart as an H x W x 3 uint8 array (for TensorBoard's add_image)."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(chart_figure(sections))  # Agg: renders into memory
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()
