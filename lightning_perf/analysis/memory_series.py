"""Memory over the steps of a run, as the utilization sampler read it, and the robust fit of its growth.

:class:`MemorySeries` is the ``memory`` part of ``perf_summary.json``: process RSS and, on a GPU, the bytes the
caching allocator holds in live tensors (``torch.cuda.memory_allocated``), each point with the global step it
was read at; with the capacities a growth would run into. :func:`fit_growth` fits MB per step over a series
(Theil-Sen with its 95% interval, Kendall's tau for "monotone-ish"), leaving out the warm-up; the rule that
turns it into a finding is :mod:`lightning_perf.analysis.rules.memory`. Pure: no torch, no Lightning.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from lightning_perf.analysis.numbers import finite
from lightning_perf.analysis.rules.thresholds import (
    MEMORY_LATE_SLOPE_SHARE,
    MEMORY_MIN_POINTS,
    MEMORY_MIN_TAU,
    MEMORY_WARMUP_SHARE,
)

# Theil-Sen takes the median of all pairwise slopes: n^2/2 of them. 500 points (125k slopes, ~10 ms) resolve a
# trend as well as the 2000 a summary may keep, so longer series are thinned evenly before the fit.
MAX_FIT_POINTS = 500


@dataclass
class MemorySeries:
    """Memory read during training steps (never during validation or checkpoints), in step order.

    ``process_rss_mb`` and ``gpu_allocated_mb`` run beside ``steps`` (one value per step, ``None`` where that
    reading failed); ``gpu_allocated_mb`` is empty when no GPU was read, ``gpu_unavailable_reason`` says why.
    ``ram_total_gb``/``ram_available_gb`` are the machine's RAM, or the process's cgroup (container) limit when
    lower, at the end of the run; ``gpu_total_gb`` is the trained device's memory and ``gpu_peak_allocated_gb``
    the allocator's peak (``torch.cuda.max_memory_allocated``) at the end; ``interval_s`` is the sampler's
    interval (one reading per step at most). MB are 1e6 bytes and GB 1e9, as
    everywhere in the summary.
    """

    steps: list[int] = field(default_factory=list)
    process_rss_mb: list[float | None] = field(default_factory=list)
    gpu_allocated_mb: list[float | None] = field(default_factory=list)
    interval_s: float | None = None
    ram_total_gb: float | None = None
    ram_available_gb: float | None = None
    gpu_device: int | None = None
    gpu_total_gb: float | None = None
    gpu_peak_allocated_gb: float | None = None
    gpu_unavailable_reason: str | None = None
    rss_unavailable_reason: str | None = None


@dataclass(frozen=True)
class Growth:
    """A fitted growth: Theil-Sen slope in MB per step with its 95% interval, over the steps after warm-up."""

    mb_per_step: float
    low: float
    high: float
    first_step: int
    last_step: int
    points: int
    tau: float  # Kendall's tau of memory against step: 1 rises at every point, 0 no order
    late_mb_per_step: float  # the slope over the later half alone: still climbing at the end?
    start_mb: float  # the fitted line at first_step and last_step
    end_mb: float
    last_mb: float  # the last value read

    @property
    def steps(self) -> int:
        return self.last_step - self.first_step

    @property
    def total_mb(self) -> float:
        return self.mb_per_step * self.steps

    @property
    def significant(self) -> bool:
        """Rising at 95% confidence, in (mostly) every stretch, and still at the end (not a warm-up jump)."""
        return (
            self.low > 0
            and self.tau >= MEMORY_MIN_TAU
            and self.late_mb_per_step >= MEMORY_LATE_SLOPE_SHARE * self.mb_per_step
        )


def _evenly(pairs: list[tuple[int, float]], limit: int) -> list[tuple[int, float]]:
    return pairs[:: max(1, math.ceil(len(pairs) / limit))]


def fit_growth(steps: Sequence[int], values_mb: Sequence[float | None]) -> Growth | None:
    """The growth of ``values_mb`` over ``steps`` after the first :data:`MEMORY_WARMUP_SHARE` of the steps;
    ``None`` when there are too few points (or steps) for a fit."""
    from scipy import stats

    pairs = [(int(s), v) for s, raw in zip(steps, values_mb, strict=False) if (v := finite(raw)) is not None]
    if len(pairs) < MEMORY_MIN_POINTS:
        return None
    first, last = pairs[0][0], pairs[-1][0]
    start = first + MEMORY_WARMUP_SHARE * (last - first)
    kept = _evenly([p for p in pairs if p[0] >= start], MAX_FIT_POINTS)
    if len(kept) < MEMORY_MIN_POINTS or len({s for s, _ in kept}) < MEMORY_MIN_POINTS:
        return None
    x = [s for s, _ in kept]
    y = [v for _, v in kept]
    slope, intercept, low, high = stats.theilslopes(y, x, alpha=0.95)
    half = len(kept) // 2
    late = stats.theilslopes(y[half:], x[half:]).slope if len(set(x[half:])) > 1 else 0.0
    tau = stats.kendalltau(x, y).statistic
    return Growth(
        mb_per_step=float(slope),
        low=float(low),
        high=float(high),
        first_step=x[0],
        last_step=x[-1],
        points=len(kept),
        tau=0.0 if math.isnan(tau) else float(tau),  # NaN: a constant series
        late_mb_per_step=float(late),
        start_mb=float(intercept + slope * x[0]),
        end_mb=float(intercept + slope * x[-1]),
        last_mb=y[-1],
    )
