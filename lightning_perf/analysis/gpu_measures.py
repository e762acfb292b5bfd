"""Which measure the GPU verdicts rest on: the GPU's own account where it exists, the host's otherwise.

- Input wait: on CUDA the GPU's idle share during fetches (CUDA events at each batch boundary) is the truth;
  host-side DataLoader wait overstates it whenever the host runs ahead of queued kernels. Without events, a
  kernel-busy share from the traces bounds it: a GPU busy 96% of profiled steps idled at most 4%.
- Utilization: NVML's utilization (sampled over training steps only), kernel-busy from the traces (the
  profiled steps) and its compute-only part (without NCCL kernels) each describe the GPU; "idle" holds only
  when every measure present agrees, and kernel-busy stands in where NVML cannot answer (MIG, NO_PERMISSION).
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning_perf.analysis.numbers import finite
from lightning_perf.analysis.numbers import fmt1 as _fmt
from lightning_perf.analysis.rules.helpers import on_cuda
from lightning_perf.analysis.rules.thresholds import EPOCH_START_SHARE_PCT
from lightning_perf.analysis.summary import RunSummary


@dataclass(frozen=True)
class Measure:
    value: float | None
    # how it was measured, for the evidence ("" when nothing was)
    source: str


def input_wait(summary: RunSummary) -> Measure:
    """Share of step time the accelerator waited for input, in percent, and the measure used."""
    timing = summary.timing
    host = finite(timing.data_wait_pct)
    gpu_wait = finite(timing.gpu_data_wait_pct)
    if gpu_wait is not None:
        also = f"; host-side DataLoader wait {_fmt(host)}%" if host is not None else ""
        return Measure(gpu_wait, f"GPU idle while the DataLoader fetched, from CUDA events{also}")
    busy = busiest_trace_share(summary)
    if host is not None and on_cuda(summary) and busy is not None and 100.0 - busy < host:
        return Measure(
            100.0 - busy,
            f"host-side DataLoader wait {_fmt(host)}%, bounded by kernel-busy {_fmt(busy)}% from the traces "
            "(the GPU idled at most the rest)",
        )
    with_starts = wait_with_epoch_starts(summary)
    if host is not None and with_starts is not None and with_starts - host >= EPOCH_START_SHARE_PCT:
        return Measure(
            with_starts,
            f"{WITH_EPOCH_STARTS}, each later epoch's start-up counted (its first fetch, "
            f"{_fmt(timing.epoch_start_ms.median if timing.epoch_start_ms else 0.0)} ms); {_fmt(host)}% "
            "without the starts",
        )
    return Measure(host, "host-side DataLoader wait" if host is not None else "")


WITH_EPOCH_STARTS = "DataLoader wait over the wall time"


def wait_with_epoch_starts(summary: RunSummary) -> float | None:
    """The DataLoader wait's share of the training wall time with each epoch's first fetch counted, in percent:
    the step figures leave the starts out, so workers that restart every short epoch can cost a third of the wall
    time while the steps read a few percent. The first epoch's start is left out: any run with workers pays it
    once, and on a short run it would outweigh the steps. ``None`` without the figures or with one epoch."""
    timing = summary.timing
    step, wait, start = timing.step_time_ms, timing.data_wait_ms, timing.epoch_start_ms
    if step is None or wait is None or start is None or timing.steps <= 0 or timing.epochs <= 1:
        return None
    starts = start.median * (timing.epochs - 1)
    total = step.mean * timing.steps + starts
    return 100.0 * (wait.mean * timing.steps + starts) / total if total > 0 else None


def busiest_trace_share(summary: RunSummary) -> float | None:
    """Kernel-busy from the traces: all kernels (a GPU waiting in NCCL is not idle for input)."""
    gpu = summary.utilization.gpu
    return finite(gpu.kernel_busy_pct) if gpu else None


def gpu_busy_measures(summary: RunSummary) -> list[tuple[str, float]]:
    """Every measure of how busy the GPU was, (label, percent), in the order the evidence names them."""
    gpu = summary.utilization.gpu
    if gpu is None:
        return []
    candidates = (
        ("NVML utilization over training steps", gpu.util_pct),
        ("kernel-busy from the traces", gpu.kernel_busy_pct),
        ("compute kernels only (no NCCL)", gpu.compute_busy_pct),
    )
    return [
        (label, value) for label, value in ((lbl, finite(v)) for lbl, v in candidates) if value is not None
    ]
