"""Diagnosis rule about the machine itself: was it busy enough with other work, or its GPU's clocks held down
enough (power cap, heat), to blur the timings?

``(summary, verdict) -> Finding | None`` like every rule; silent when the machine's state was not recorded.
"""

from __future__ import annotations

from lightning_perf.analysis.numbers import finite
from lightning_perf.analysis.numbers import fmt1 as _fmt
from lightning_perf.analysis.rules.helpers import others_busy
from lightning_perf.analysis.rules.inputs.loading import machine_busy
from lightning_perf.analysis.rules.thresholds import (
    NOISY_GPU_SLOWDOWN_PCT,
    NOISY_STEAL_PCT,
)
from lightning_perf.analysis.summary import Finding, MachineState, RunSummary

BUSY_TITLE = "The machine was busy with other work while this run measured"
HELD_TITLE = "Other processes held the cores this run needed"
GPU_SLOWED_TITLE = "The GPU's clocks were held down while this run measured"


def noisy_machine(summary: RunSummary, verdict: str | None) -> Finding | None:
    machine = summary.machine
    if machine is None:
        return None
    other, steal, cores = finite(machine.other_cores), finite(machine.steal_pct), machine.cpu_count
    busy = others_busy(summary)
    stolen = steal is not None and steal >= NOISY_STEAL_PCT
    slowed = {r: s for r, s in machine.gpu_slowdown_pct.items() if s >= NOISY_GPU_SLOWDOWN_PCT}
    if not (busy or stolen or slowed):
        return None
    held = machine_busy(summary)
    if held is not None:  # it leads the diagnosis: the CPU figures of this run say more about the others
        gpu = (
            f"; {_gpu_cause(slowed, machine.gpu_sm_clock_mhz, machine.gpu_sm_clock_max_mhz)}"
            if slowed
            else ""
        )
        return Finding(
            id="noisy_machine",
            severity="high",
            title=HELD_TITLE,
            evidence=f"During the run {held}{gpu}: the run's CPU figures (and any CPU-bound verdict) are not its "
            f"own; timings may be off by {_effect(summary, other, cores, machine if slowed else None)}.",
            recommendation="Free the cores (stop the other jobs, or give this job its own cores: `taskset`, "
            "SLURM `--cpus-per-task`) and measure again before acting on CPU-side advice; "
            "compare settings with `lightning-perf trial --repeats N` (interleaved rounds)."
            + (_GPU_ADVICE if slowed else ""),
        )
    causes = []
    if busy:
        assert other is not None and cores
        causes.append(f"other processes used {other:.1f} of {cores} cores ({_fmt(100.0 * other / cores)}%)")
    if stolen:
        causes.append(f"the hypervisor took {_fmt(steal)}% of CPU time for other guests (steal)")
    if slowed:
        causes.append(_gpu_cause(slowed, machine.gpu_sm_clock_mhz, machine.gpu_sm_clock_max_mhz))
    if machine.load_avg_1m is not None and (busy or stolen):
        causes.append(f"load average {machine.load_avg_1m:.2f}")
    return Finding(
        id="noisy_machine",
        severity="low",
        title=BUSY_TITLE if busy or stolen else GPU_SLOWED_TITLE,
        evidence=f"During the run {'; '.join(causes)}: timings may be off by "
        f"{_effect(summary, other if busy else None, cores, machine if slowed else None)}.",
        recommendation="Compare runs with `lightning-perf trial --repeats N` (interleaved rounds, intervals) "
        "or measure on a quiet machine before acting on small differences." + (_GPU_ADVICE if slowed else ""),
    )


_GPU_ADVICE = (
    " A GPU held at its power cap or thermal limit runs slower than its peak: check its cooling and power "
    "limit (`nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE`) and compare runs only at the same clocks."
)


def _gpu_cause(slowed: dict[str, float], clock: float | None, top: float | None) -> str:
    reasons = ", ".join(f"{reason} in {_fmt(share)}%" for reason, share in sorted(slowed.items()))
    cause = f"the GPU's clocks were held down ({reasons} of the training samples)"
    if clock is not None and top:
        cause += f"; its SM clock averaged {clock:.0f} of {top:.0f} MHz"
    return cause


def _effect(summary: RunSummary, other: float | None, cores: int | None, machine: MachineState | None) -> str:
    """How far off: the run's own step spread where measured, the CPU share others took, the clock shortfall."""
    parts = []
    step = summary.timing.step_time_ms
    if step is not None and step.p10 is not None and step.median > 0:
        spread = 100.0 * (step.p90 - step.p10) / step.median
        parts.append(
            f"as much as the step-to-step spread of this run (p10-p90 {_fmt(spread)}% of the median)"
        )
    if other is not None and cores:
        parts.append(f"up to ~{_fmt(100.0 * other / cores)}% on CPU-bound steps (the share others took)")
    if machine is not None and machine.gpu_sm_clock_mhz is not None and machine.gpu_sm_clock_max_mhz:
        shortfall = max(0.0, 100.0 * (1.0 - machine.gpu_sm_clock_mhz / machine.gpu_sm_clock_max_mhz))
        parts.append(
            f"up to ~{_fmt(shortfall)}% on GPU-bound steps (the SM clock's shortfall from its maximum)"
        )
    return " and ".join(parts) if parts else "an unknown amount"
