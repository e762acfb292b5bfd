"""Diagnosis rule about the machine itself: was it busy enough with other work to blur the timings?

``(summary, verdict) -> Finding | None`` like every rule; silent when the machine's state was not recorded.
"""

from __future__ import annotations

from lightning_perf.analysis.numbers import finite
from lightning_perf.analysis.numbers import fmt1 as _fmt
from lightning_perf.analysis.summary import Finding, RunSummary
from lightning_perf.analysis.thresholds import NOISY_OTHER_CPU_SHARE, NOISY_STEAL_PCT


def noisy_machine(summary: RunSummary, verdict: str | None) -> Finding | None:
    machine = summary.machine
    if machine is None:
        return None
    other, steal, cores = finite(machine.other_cores), finite(machine.steal_pct), machine.cpu_count
    busy = other is not None and bool(cores) and other >= NOISY_OTHER_CPU_SHARE * cores
    stolen = steal is not None and steal >= NOISY_STEAL_PCT
    if not (busy or stolen):
        return None
    causes = []
    if busy:
        assert other is not None and cores
        causes.append(f"other processes used {other:.1f} of {cores} cores ({_fmt(100.0 * other / cores)}%)")
    if stolen:
        causes.append(f"the hypervisor took {_fmt(steal)}% of CPU time for other guests (steal)")
    if machine.load_avg_1m is not None:
        causes.append(f"load average {machine.load_avg_1m:.2f}")
    return Finding(
        id="noisy_machine",
        severity="low",
        title="The machine was busy with other work while this run measured",
        evidence=f"During the run {', '.join(causes)}: timings may be off by {_effect(summary, other, cores)}.",
        recommendation="Compare runs with `lightning-perf trial --repeats N` (interleaved rounds, intervals) "
        "or measure on a quiet machine before acting on small differences.",
    )


def _effect(summary: RunSummary, other: float | None, cores: int | None) -> str:
    """How far off: the run's own step spread where measured, and the CPU share others took."""
    parts = []
    step = summary.timing.step_time_ms
    if step is not None and step.p10 is not None and step.median > 0:
        spread = 100.0 * (step.p90 - step.p10) / step.median
        parts.append(
            f"as much as the step-to-step spread of this run (p10-p90 {_fmt(spread)}% of the median)"
        )
    if other is not None and cores:
        parts.append(f"up to ~{_fmt(100.0 * other / cores)}% on CPU-bound steps (the share others took)")
    return " and ".join(parts) if parts else "an unknown amount"
