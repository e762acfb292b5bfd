"""The ``memory_growth`` finding from the utilization sampler's memory series, in every run.

Memory that climbs step after step is mostly tensors kept with their graph across steps (``self.outputs.append(
loss)`` instead of ``loss.detach()``): :func:`memory_growth` fits the growth of the process's RSS and of the GPU
allocator (:mod:`lightning_perf.analysis.memory_series`) and says how fast it grows and when memory runs out.
Without growth, the GPU's peak against its capacity gets headroom or larger-batch advice
(:func:`capacity_finding`, shared with the trace rule), unless a trace with memory events already gives it.
Pure: no torch, no Lightning.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning_perf.analysis.memory_series import Growth, MemorySeries, fit_growth
from lightning_perf.analysis.numbers import MB_PER_GB, finite, size_text
from lightning_perf.analysis.numbers import fmt1 as _fmt
from lightning_perf.analysis.rules.thresholds import (
    GPU_GROWTH_MIN_MB,
    MEMORY_ETA_HIGH_RUNS,
    MEMORY_MIN_POINTS,
    RSS_GROWTH_MIN_MB,
)
from lightning_perf.analysis.rules.trace_thresholds import (
    MEMORY_GROWTH_MIN_MB_PER_STEP,
    MEMORY_NEAR_CAPACITY_PCT,
    MEMORY_ROOM_PCT,
)
from lightning_perf.analysis.summary import Finding, RunSummary

LEAK_RECOMMENDATION = (
    "Keep no tensors with their graph across steps: store `loss.detach()` (or `.item()` at epoch end), not "
    "`loss`, in lists such as `self.outputs`"
)


def capacity_finding(peak_gb: float | None, capacity_gb: float | None, source: str = "") -> Finding | None:
    """Headroom advice when the GPU's peak is near its capacity, larger-batch advice when far below; None in
    between or when either figure is missing. ``source`` (e.g. " over the run") follows the evidence."""
    peak, capacity = finite(peak_gb), finite(capacity_gb)
    if peak is None or not capacity:
        return None
    used = 100.0 * peak / capacity
    evidence = f"Peak allocated {_fmt(peak)} GB, {_fmt(used)}% of {_fmt(capacity)} GB{source}."
    if used >= MEMORY_NEAR_CAPACITY_PCT:
        return Finding(
            id="memory_growth",
            severity="medium",
            title="Peak GPU memory is near the device's capacity",
            evidence=evidence,
            recommendation='Leave headroom: `precision="bf16-mixed"`, activation checkpointing, or a smaller '
            "batch with `accumulate_grad_batches`.",
        )
    if used < MEMORY_ROOM_PCT:
        return Finding(
            id="memory_growth",
            severity="info",
            title="GPU memory has room for a larger batch",
            evidence=evidence,
            recommendation="A larger batch would use the free memory (scale the learning rate with it).",
        )
    return None


@dataclass(frozen=True)
class _Grown:
    name: str  # for the title: "GPU memory", "host memory"
    what: str  # for the evidence: "GPU memory (allocated)", "Process RSS"
    growth: Growth
    headroom_gb: float | None  # what is left to fill
    room: str  # what the headroom is, in words

    @property
    def steps_left(self) -> float | None:
        if self.headroom_gb is None:
            return None
        return max(0.0, self.headroom_gb) * MB_PER_GB / self.growth.mb_per_step

    def sentence(self) -> str:
        g = self.growth
        text = (
            f"{self.what} rises {g.mb_per_step:.3g} MB a step (95% interval {g.low:.3g}-{g.high:.3g}) over "
            f"steps {g.first_step}-{g.last_step} ({g.points} readings after warm-up, {size_text(g.start_mb)} -> "
            f"{size_text(g.end_mb)})"
        )
        if self.steps_left is not None:
            text += f"; at this rate the {_fmt(self.headroom_gb)} GB {self.room} is used up in ~{self.steps_left:.0f} steps"
        return text + "."


def _grown(series: MemorySeries) -> list[_Grown]:
    found = []
    gpu = fit_growth(series.steps, series.gpu_allocated_mb)
    if gpu is not None and gpu.significant and gpu.total_mb >= GPU_GROWTH_MIN_MB:
        total, peak = finite(series.gpu_total_gb), finite(series.gpu_peak_allocated_gb)
        peak = max(peak or 0.0, gpu.last_mb / MB_PER_GB)
        headroom = None if total is None else total - peak
        found.append(
            _Grown(
                "GPU memory", "GPU memory (allocated)", gpu, headroom, f"left of the {_fmt(total)} GB device"
            )
        )
    rss = fit_growth(series.steps, series.process_rss_mb)
    if rss is not None and rss.significant and rss.total_mb >= RSS_GROWTH_MIN_MB:
        found.append(
            _Grown(
                "host memory", "Process RSS", rss, finite(series.ram_available_gb), "of RAM free at the end"
            )
        )
    return found


TOO_SHORT_TITLE = "Too short to judge memory growth"


def _short_rise(what: str, steps: list[int], values: list[float | None], line_mb: float) -> str | None:
    """The readings of a series too short for a fit (:func:`fit_growth` gives None) that still rose by at least
    ``line_mb`` from its first reading to its last, in words; None otherwise."""
    pairs = [(s, v) for s, raw in zip(steps, values, strict=False) if (v := finite(raw)) is not None]
    if len(pairs) < 2 or fit_growth(steps, values) is not None or pairs[-1][1] - pairs[0][1] < line_mb:
        return None
    readings = ", ".join(size_text(v) for _, v in pairs)
    return (
        f"{what} rose {size_text(pairs[-1][1] - pairs[0][1])} over steps {pairs[0][0]}-{pairs[-1][0]} in "
        f"{len(pairs)} readings ({readings})"
    )


def too_short_finding(series: MemorySeries) -> Finding | None:
    """Memory that rose in a run too short to fit its growth: say so, with the readings, rather than nothing."""
    rises = [
        rise
        for rise in (
            _short_rise("GPU memory (allocated)", series.steps, series.gpu_allocated_mb, GPU_GROWTH_MIN_MB),
            _short_rise("Process RSS", series.steps, series.process_rss_mb, RSS_GROWTH_MIN_MB),
        )
        if rise is not None
    ]
    if not rises:
        return None
    return Finding(
        id="memory_growth",
        severity="info",
        title=TOO_SHORT_TITLE,
        evidence="; ".join(rises)
        + f". Telling a leak from warm-up needs at least {MEMORY_MIN_POINTS} readings "
        "after the warm-up steps.",
        recommendation=f"Run longer (at least {MEMORY_MIN_POINTS} readings after warm-up: more steps, or a "
        "shorter `util_interval_s`) to judge whether memory keeps growing.",
    )


def _severity(grown: list[_Grown], steps_run: int) -> str:
    left = [g.steps_left for g in grown if g.steps_left is not None]
    if left and min(left) <= MEMORY_ETA_HIGH_RUNS * max(steps_run, 1):
        return "high"
    if any(g.growth.mb_per_step >= MEMORY_GROWTH_MIN_MB_PER_STEP for g in grown):
        return "medium"
    return "low"


def _trace_has_memory(summary: RunSummary) -> bool:
    return any(f.memory_peak_gb is not None and f.memory_absolute for f in summary.trace_figures)


def memory_growth(summary: RunSummary, verdict: str | None) -> Finding | None:
    """Growth of the process RSS or GPU allocator over the steps, else the GPU's peak against its capacity."""
    series = summary.memory
    if series is None:
        return None
    grown = _grown(series)
    if not grown:
        short = too_short_finding(series)
        if short is not None:
            return short
        if _trace_has_memory(summary):  # the trace rule gives the peak from the allocator's own events
            return None
        return capacity_finding(series.gpu_peak_allocated_gb, series.gpu_total_gb, " over the run")
    names = [g.name for g in grown]
    title = " and ".join(names) + (" grow" if len(names) > 1 else " grows") + " step after step"
    host = any(g.name == "host memory" for g in grown)
    return Finding(
        id="memory_growth",
        severity=_severity(grown, series.steps[-1] if series.steps else 0),
        title=title[0].upper() + title[1:],
        evidence=" ".join(g.sentence() for g in grown),
        recommendation=LEAK_RECOMMENDATION
        + (
            "; gather per-step values in a running aggregate (e.g. a torchmetrics metric), not a growing list."
            if host
            else "."
        ),
    )
