"""The utilization sampler's running statistics: sums, counts and peaks per metric, and what they give.

Kept apart from :mod:`lightning_perf.collect.sampling.utilization` (the sampler's thread and backends) so each stays short.
"""

from __future__ import annotations

from typing import Any

from lightning_perf.analysis.summary import GpuUtilization
from lightning_perf.collect.sampling.nvml import (
    GPU_MEM_USED,
    GPU_MEM_UTIL,
    GPU_POWER,
    GPU_SM_CLOCK,
    GPU_UTIL,
    SLOWDOWN_KEY,
)


class Stats:
    """Running weighted sum, weight and peak per metric; means() holds only metrics that have samples.

    GPU samples are point readings taken at a steady pace (weight 1 each); a CPU reading is a rate over the
    seconds since the previous one, so it weighs as many seconds as it covers: a short forced read at a window's
    end must not count as much as a whole second."""

    __slots__ = ("sums", "counts", "peaks")

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, float] = {}
        self.peaks: dict[str, float] = {}

    def add(self, values: dict[str, float], weight: float = 1.0) -> None:
        for key, value in values.items():
            self.sums[key] = self.sums.get(key, 0.0) + value * weight
            self.counts[key] = self.counts.get(key, 0.0) + weight
            self.peaks[key] = max(value, self.peaks.get(key, value))

    def means(self) -> dict[str, float]:
        return {key: total / self.counts[key] for key, total in self.sums.items()}


def gpu_figures(means: dict[str, float], peak: float | None, name: str | None, cc: Any) -> GpuUtilization:
    return GpuUtilization(
        device_name=name,
        util_pct=means.get(GPU_UTIL),
        mem_util_pct=means.get(GPU_MEM_UTIL),
        mem_used_gb=means.get(GPU_MEM_USED),
        peak_mem_used_gb=peak,
        power_w=means.get(GPU_POWER),
        compute_capability=cc,
    )


def clock_figures(
    per_device: list[dict[str, float]], max_clocks: list[float | None]
) -> tuple[float | None, float | None, dict[str, float]]:
    """From each GPU's sample means: the slowest GPU's SM clock and its maximum, and the largest share (%) of
    samples each slowdown reason held on any GPU (the one that slows a synchronous step)."""
    clocks = [
        (means[GPU_SM_CLOCK], top)
        for means, top in zip(per_device, max_clocks, strict=False)
        if GPU_SM_CLOCK in means
    ]
    clock, top = min(clocks, key=lambda pair: pair[0], default=(None, None))
    slowdown: dict[str, float] = {}
    for means in per_device:
        for key, share in means.items():
            if key.startswith(SLOWDOWN_KEY):
                reason = key[len(SLOWDOWN_KEY) :]
                slowdown[reason] = max(slowdown.get(reason, 0.0), 100.0 * share)
    return clock, top, slowdown
