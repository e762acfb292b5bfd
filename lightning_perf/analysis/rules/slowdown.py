"""The ``slowdown`` finding: the step time rose to a lasting higher level somewhere in the run.

The change points come from :mod:`lightning_perf.analysis.changepoint` (found online, window by window, and
kept in ``summary.slowdowns``). The finding says from which step, by how much (with the interval), how the
rise splits between DataLoader wait and compute, what that points at, what else coincides (GPU clocks held
down, memory growing across the change, other processes busy) and where the extra trace of the slow period
is. ``(summary, verdict) -> Finding | None`` like every rule. Pure: no torch, no Lightning.
"""

from __future__ import annotations

import statistics

from lightning_perf.analysis.changepoint import Slowdown
from lightning_perf.analysis.numbers import finite
from lightning_perf.analysis.rules.helpers import others_busy
from lightning_perf.analysis.rules.thresholds import (
    GPU_GROWTH_MIN_MB,
    NOISY_GPU_SLOWDOWN_PCT,
    RSS_GROWTH_MIN_MB,
)
from lightning_perf.analysis.summary import Finding, RunSummary

# 1.5x and more is "high": a third of the run's throughput gone from that step on (the example, 120 ->
# 190 ms, is 1.58x); smaller lasting rises (the detector's floor is 1.25x) are "medium".
HIGH_RATIO = 1.5
# The part of the rise that names the cause: the DataLoader wait or the compute carrying over half of it.
CAUSE_SHARE = 0.5
EXTRA_TRACE_LABEL = "_slowdown."


def slowdown(summary: RunSummary, verdict: str | None) -> Finding | None:
    if not summary.slowdowns:
        return None
    worst = max(summary.slowdowns, key=lambda s: s.ratio)
    split, cause = _split(worst)
    evidence = (
        f"From step {worst.step:,} the mean step rose {worst.before_ms:.1f} -> {worst.after_ms:.1f} ms "
        f"({worst.ratio:.2f}x, 95% interval {worst.low:.2f}-{worst.high:.2f}x; {worst.windows_before} logging "
        f"windows before, {worst.windows_after} after, Mann-Whitney p={worst.p_value:.2g}){split}: {cause}."
    )
    coinciding = _coinciding(summary, worst)
    if coinciding:
        evidence += f" At the same time: {'; '.join(coinciding)}."
    others = [s for s in summary.slowdowns if s is not worst]
    if others:
        evidence += " Also: " + "; ".join(f"from step {s.step:,} {s.ratio:.2f}x" for s in others) + "."
    trace = _extra_trace(summary, worst)
    where = (
        f"An extra profiler trace of the slow period was recorded ({trace}): `lightning-perf report "
        f"{summary.log_dir or 'RUN_DIR'}` sets it beside the first cycle, component by component."
        if trace
        else "Record a trace of the slow period with `lightning-perf capture RUN_DIR` while it runs."
    )
    return Finding(
        id="slowdown",
        severity="high" if worst.ratio >= HIGH_RATIO else "medium",
        title=f"Training slowed {worst.ratio:.2f}x from step {worst.step:,} and stayed slower",
        evidence=evidence,
        recommendation=f"{_advice(cause)} {where}",
    )


def _split(found: Slowdown) -> tuple[str, str]:
    """(": DataLoader wait +65 ms, compute +5 ms", the cause) from the wait and compute means."""
    rise = found.after_ms - found.before_ms
    if found.before_wait_ms is None or found.after_wait_ms is None or found.after_compute_ms is None:
        return "", "the DataLoader wait was not measured, so the cause is not split"
    wait = found.after_wait_ms - found.before_wait_ms
    compute = found.after_compute_ms - (found.before_compute_ms or 0.0)
    split = f": DataLoader wait {wait:+.1f} ms, compute {compute:+.1f} ms"
    if wait >= CAUSE_SHARE * rise:
        return split, "the input pipeline slowed"
    if compute >= CAUSE_SHARE * rise:
        return split, "the training step itself slowed"
    return split, "both the input pipeline and the training step slowed"


def _advice(cause: str) -> str:
    if cause == "the input pipeline slowed":
        return (
            "Look at what the data comes from after that step: a shard on slower storage, a cache that filled, "
            "a network mount, DataLoader workers starved of CPU."
        )
    if cause == "the training step itself slowed":
        return (
            "Look at what changed in the step: input sizes (recompiles), memory growth or fragmentation, GPU "
            "clocks (heat, power cap), a schedule that switches something on at that step."
        )
    return "Compare the slow period with the start of the run to see which part grew."


def _coinciding(summary: RunSummary, found: Slowdown) -> list[str]:
    notes = []
    machine = summary.machine
    if machine is not None:
        held = {r: s for r, s in machine.gpu_slowdown_pct.items() if s >= NOISY_GPU_SLOWDOWN_PCT}
        if held:
            reasons = ", ".join(f"{r} {s:.0f}%" for r, s in sorted(held.items()))
            notes.append(f"the GPU's clocks were held down during the run ({reasons} of the samples)")
        if others_busy(summary):
            notes.append(
                f"other processes used {machine.other_cores:.1f} of {machine.cpu_count} cores during the run"
            )
    notes += _recompiles_near(summary, found)
    memory = summary.memory
    if memory is not None:
        for name, values, least in (
            ("process RSS", memory.process_rss_mb, RSS_GROWTH_MIN_MB),
            ("GPU memory allocated", memory.gpu_allocated_mb, GPU_GROWTH_MIN_MB),
        ):
            grew = _across(memory.steps, values, found.step)
            if grew is not None and grew[1] - grew[0] >= least:
                notes.append(f"{name} grew {grew[0]:.0f} -> {grew[1]:.0f} MB across step {found.step:,}")
    return notes


def _recompiles_near(summary: RunSummary, found: Slowdown) -> list[str]:
    """torch.compile events from a window before the change to its confirmation: a recompiled graph (or the
    recompile limit, after which dynamo runs the function uncompiled) can be what made the steps slower."""
    if summary.compile is None:
        return []
    window = max(1, (found.detected_step - found.step) // max(1, found.windows_after))
    notes = []
    for event in summary.compile.events:
        if not found.step - window <= event.step <= found.detected_step:
            continue
        if event.failure is not None:
            notes.append(
                f"torch.compile gave up at step {event.step:,} ({event.failure}): it runs uncompiled since"
            )
        elif event.recompile_reason is not None:
            notes.append(f"torch.compile recompiled at step {event.step:,} ({event.recompile_reason})")
    return notes


def _across(steps: list[int], values: list[float | None], at: int) -> tuple[float, float] | None:
    """Median memory before and after global step ``at``; None unless both sides were read."""
    read = [(s, value) for s, v in zip(steps, values, strict=False) if (value := finite(v)) is not None]
    before, after = [v for s, v in read if s < at], [v for s, v in read if s >= at]
    if not before or not after:
        return None
    return statistics.median(before), statistics.median(after)


def _extra_trace(summary: RunSummary, found: Slowdown) -> str | None:
    if found.cycle_batch is None:
        return None
    for trace in summary.traces:
        if EXTRA_TRACE_LABEL in trace.path and trace.steps and trace.steps[0] >= found.cycle_batch:
            return f"{trace.path}, batches {trace.steps[0]}-{trace.steps[-1]}"
    return None
