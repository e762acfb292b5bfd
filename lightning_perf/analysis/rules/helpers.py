"""Helpers the diagnosis rules share: reading a summary's settings and shaping evidence."""

from __future__ import annotations

import math
from typing import Any

from lightning_perf.analysis.numbers import finite as _num
from lightning_perf.analysis.numbers import fmt1 as _fmt
from lightning_perf.analysis.rules.thresholds import (
    CUDA_ACCELERATORS,
    NOISY_OTHER_CPU_SHARE,
    OVERHEAD_SHARE_PCT,
)
from lightning_perf.analysis.summary import RunSummary


def means(summary: RunSummary) -> str:
    """The step and wait the wait share is made of (share = mean wait / mean step)."""
    step, wait = summary.timing.step_time_ms, summary.timing.data_wait_ms
    if step is None or wait is None:
        return ""
    steps = summary.timing.steps
    over = f"over all {steps} timed steps: " if steps else ""  # which steps a figure covers (issue 49)
    return f" ({over}mean step {_fmt(step.mean)} ms, mean wait {_fmt(wait.mean)} ms)"


def others(count: int) -> str:
    return "the other rank" if count == 1 else f"the other {count} ranks"


def on_cuda(summary: RunSummary) -> bool:
    accelerator = summary.settings.accelerator
    return isinstance(accelerator, str) and accelerator.lower() in CUDA_ACCELERATORS


def others_busy(summary: RunSummary) -> bool:
    """Other processes used a noisy share (``NOISY_OTHER_CPU_SHARE``) of the machine's cores during the run;
    unknown: False."""
    machine = summary.machine
    if machine is None:
        return False
    other, cores = _num(machine.other_cores), machine.cpu_count
    if other is None or not cores:
        return False
    return other >= NOISY_OTHER_CPU_SHARE * cores


def usable_cores(summary: RunSummary) -> int | None:
    cpu = summary.utilization.cpu
    return summary.settings.cpu_count or (cpu.cpu_count if cpu else None) or None


def lightning_worker_bound(cores: int, local_ranks: int) -> int:
    # Lightning's suggested_max_num_workers: a share of the cores per local process, one left for the process
    return max(1, cores // local_ranks - 1)


def share_pct(part_s: float | None, whole_s: float | None) -> float | None:
    part, whole = _num(part_s), _num(whole_s)
    if part is None or whole is None or whole <= 0 or part <= 0:
        return None  # 0.0 is the "not measured" default of these fields
    return 100.0 * part / whole


def every_n(part_s: float, whole_s: float) -> int:
    """How much rarer the overhead must run to drop below OVERHEAD_SHARE_PCT of the wall time (at least 2)."""
    rest, line = max(whole_s - part_s, 1e-9), OVERHEAD_SHARE_PCT / 100.0
    # part/n / (rest + part/n) < line  <=>  n > part * (1 - line) / (line * rest)
    return max(2, math.floor(part_s * (1 - line) / (line * rest)) + 1)


def change_text(change: dict[str, Any]) -> str:
    """A settings change as the user writes it: `num_workers=4`, `pin_memory=True`."""
    return ", ".join(f"`{k}={v!r}`" for k, v in change.items())
