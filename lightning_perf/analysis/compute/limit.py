"""How far a run is from its device's limit: the ``compute_limit`` part of ``perf_summary.json``.

The FLOPs of one training step (counted once a fit by :mod:`lightning_perf.collect.flop_count`, or the user's
``flops_per_batch``), the device's matmul peak (measured by :mod:`lightning_perf.probes.device_peak`, and the
datasheet's from :mod:`lightning_perf.analysis.compute.datasheet_peaks`), and what the run achieved against them (MFU).
Read by the ``low_mfu`` rule and the end-of-fit answer. Pure: no torch, no Lightning.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lightning_perf.analysis.numbers import finite

# Modules kept in a summary, the most FLOPs first: the few that hold a step's arithmetic are what a reader needs.
MAX_MODULES = 20


@dataclass
class ModuleFlops:
    """One module's FLOPs in the counted step (its forward and backward; its submodules' included)."""

    path: str  # the module's dotted name in the LightningModule's ``named_modules()``
    flops: float
    leaf: bool = True  # no submodule of it is listed: its FLOPs are its own operators'


@dataclass
class StepFlops:
    """The FLOPs of one training step, as counted or given."""

    flops: float
    source: str = "counted"  # "counted" (FlopCounterMode over one step) or "user" (``flops_per_batch``)
    # the training batch counted (0-based, across epochs); None for the user's figure
    batch: int | None = None
    # FLOPs per operator (e.g. "aten.mm") and how often each ran in the step
    operators: dict[str, float] = field(default_factory=dict)
    operator_calls: dict[str, int] = field(default_factory=dict)
    modules: list[ModuleFlops] = field(default_factory=list)
    # what the count could not see, in words (a compiled region, a step with no countable operator)
    not_counted: list[str] = field(default_factory=list)

    @property
    def calls(self) -> int:
        return sum(self.operator_calls.values())


@dataclass
class DevicePeak:
    """The device's matmul peak for the run's dtype: measured here, and the datasheet's where known."""

    device: str  # "cpu" or "cuda:0"
    device_name: str  # the CPU model or the GPU's name
    dtype: str  # "fp32", "tf32", "bf16", "fp16", "fp64"
    measured_flops_per_s: float | None = None
    measured_size: int | None = None  # the square matmul timed (n x n by n x n)
    cached: bool = False  # read from the cache of an earlier measurement (per device and dtype)
    measured_at: str | None = None
    # cores other processes used while the matmuls were timed (of ``cpu_count``): with a noisy share of them
    # (``busy``) the figure is what the matmul got beside them, below the machine's peak
    others_cores: float | None = None
    cpu_count: int | None = None
    busy: bool = False
    datasheet_flops_per_s: float | None = None
    datasheet_device: str | None = None  # the datasheet's name for the device (e.g. "H100 SXM")
    datasheet_source: str | None = None  # the datasheet's address


@dataclass
class ComputeLimit:
    """The step's FLOPs, the achieved rate, and the model FLOPs utilization against each peak."""

    step: StepFlops
    peak: DevicePeak | None = None
    step_time_ms: float | None = None  # the mean step time the rate is over
    achieved_flops_per_s: float | None = None
    mfu_pct: float | None = None  # against the measured peak
    datasheet_mfu_pct: float | None = None
    # why there is no ``mfu_pct`` though a rate was achieved against a measured peak: it came out above 100%,
    # so the peak (or the step's FLOP count) is wrong
    mfu_not_computed: str | None = None
    # seconds the end of fit spent on the peak (0 when cached)
    peak_seconds: float = 0.0


def run_dtype(precision: str | None, float32_matmul_precision: str | None, cuda: bool) -> str | None:
    """The dtype a run's matmuls run in, from Lightning's ``precision`` (None: one this cannot tell, e.g.
    transformer-engine). fp32 on CUDA with ``float32_matmul_precision`` "high"/"medium" runs TF32."""
    text = str(precision or "32-true")
    if text.startswith("bf16"):
        return "bf16"
    if text.startswith("16") or text == "half":
        return "fp16"
    if text.startswith("64") or text == "double":
        return "fp64"
    if text.startswith("32") or text == "full":
        return "tf32" if cuda and float32_matmul_precision in ("high", "medium") else "fp32"
    return None


def compute_limit(step: StepFlops, peak: DevicePeak | None, step_time_ms: float | None) -> ComputeLimit:
    """The achieved FLOP/s over the mean step, and its share of each peak known."""
    result = ComputeLimit(step=step, peak=peak, step_time_ms=finite(step_time_ms))
    if result.step_time_ms is None or result.step_time_ms <= 0 or step.flops <= 0:
        return result
    achieved = step.flops / (result.step_time_ms / 1e3)
    result.achieved_flops_per_s = achieved
    if peak is None:
        return result
    mfu = _pct(achieved, peak.measured_flops_per_s)
    if mfu is not None and mfu > 100.0:  # no step outruns the device: the figure would be the peak's error
        result.mfu_not_computed = _over_the_peak(result, peak)
    else:
        result.mfu_pct = mfu
    datasheet = _pct(achieved, peak.datasheet_flops_per_s)
    # above the datasheet's peak only a wrong FLOP count can be: no figure
    result.datasheet_mfu_pct = datasheet if datasheet is not None and datasheet <= 100.0 else None
    return result


def _pct(achieved: float, peak: float | None) -> float | None:
    return achieved / peak * 100.0 if peak else None


def _over_the_peak(limit: ComputeLimit, peak: DevicePeak) -> str:
    """Why the MFU is not given when the step's rate exceeds the measured peak, in the measured figures."""
    measured = f"{flops_text(peak.measured_flops_per_s or 0.0)}/s"
    if peak.busy:
        held = f" ({_others_text(peak)})" if peak.others_cores is not None else ""
        return f"the measured peak {measured} was taken while other processes held the cores{held}; MFU not computed"
    count = "flops_per_batch" if limit.step.source == "user" else "the step's FLOP count"
    return (
        f"the step's {flops_text(limit.achieved_flops_per_s or 0.0)}/s exceed the measured peak {measured} "
        f"{peak.dtype} matmul: the peak, or {count}, is wrong; MFU not computed"
    )


def _others_text(peak: DevicePeak) -> str:
    of = f" of {peak.cpu_count}" if peak.cpu_count else ""
    return f"they used {peak.others_cores or 0.0:.1f}{of} cores"


def flops_text(value: float) -> str:
    """FLOPs (or FLOP/s without the "/s") in the unit that shows them: ``12.4 GFLOP``, ``180 MFLOP``."""
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} FLOP"


def pct_text(value: float) -> str:
    """A share in percent, with the digits that show it: ``38``, ``4.2``, ``0.05``."""
    return f"{value:.0f}" if value >= 10 else f"{value:.2g}"


def mfu_line(limit: ComputeLimit) -> str | None:
    """The end-of-fit line: "12.4 GFLOP a step at 38 GFLOP/s: 21% of this CPU's measured 180 GFLOP/s fp32
    matmul"; None without an achieved rate."""
    step, peak, achieved = limit.step, limit.peak, limit.achieved_flops_per_s
    if achieved is None:
        return None
    given = " (flops_per_batch)" if step.source == "user" else ""
    line = f"{flops_text(step.flops)} a step{given} at {flops_text(achieved)}/s"
    if limit.mfu_not_computed is not None:
        return line + f" ({limit.mfu_not_computed})"
    if peak is None or limit.mfu_pct is None:
        return line + " (the device's peak was not measured)"
    where = "this CPU" if peak.device == "cpu" else peak.device_name
    line += (
        f": {pct_text(limit.mfu_pct)}% of {where}'s measured {flops_text(peak.measured_flops_per_s or 0.0)}/s "
        f"{peak.dtype} matmul"
    )
    if peak.busy and peak.others_cores is not None:  # a peak beside others' work: the MFU reads high
        line += f" (measured while other processes held the cores: {_others_text(peak)})"
    if limit.datasheet_mfu_pct is not None and peak.datasheet_flops_per_s:
        line += (
            f", {pct_text(limit.datasheet_mfu_pct)}% of the {peak.datasheet_device} datasheet's "
            f"{flops_text(peak.datasheet_flops_per_s)}/s"
        )
    return line
