"""The run summary: what one run measured, as plain dataclasses and a versioned JSON file.

Everything downstream of the callback (diagnosis, comparison, the report, the HParams tab) reads a
:class:`RunSummary`, never the callback itself. The JSON form is ``perf_summary.json`` in the run's log dir.
This module imports nothing from Lightning.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lightning_perf.analysis.changepoint import Slowdown
from lightning_perf.analysis.compile_summary import CompileSummary
from lightning_perf.analysis.compute.anatomy import StepAnatomy
from lightning_perf.analysis.compute.limit import ComputeLimit
from lightning_perf.analysis.memory_series import MemorySeries
from lightning_perf.analysis.probe_results import Probes
from lightning_perf.analysis.summary_decode import FieldError, build, suspects
from lightning_perf.analysis.trace_figures import TraceFigures
from lightning_perf.analysis.verdicts.statistics import median_interval
from lightning_perf.atomic_file import atomic_open
from lightning_perf.errors import ConfigError, LightningPerfError

SUMMARY_FILENAME = "perf_summary.json"
SCHEMA_NAME = "lightning-perf/run-summary"
SCHEMA_VERSION = 1
# A summary is a few KiB (tens with probes and many ranks); a file this large is not one, and is not read whole.
MAX_SUMMARY_BYTES = 16 << 20
# The deepest a summary nests is ~5 (probes.num_workers.candidates[i].error); 32 leaves room for free-form probes.
MAX_SUMMARY_DEPTH = 32
# The parts holding measured figures: none of their numbers can be negative, infinite or NaN.
_MEASURED_SECTIONS = ("timing", "utilization", "ranks", "memory", "compile", "compute_limit", "anatomy")


class SummaryError(LightningPerfError, ValueError):
    """A summary file is missing, truncated, corrupt or of an unknown schema. The message names the file."""


# Per-step samples kept in a summary, for the tests ``compare`` runs on them: enough for a bootstrap of the
# median (a 95% interval moves by under 1% beyond ~1000 samples) while a summary stays well under 100 kB.
MAX_SAMPLES = 2000
# Decimals of a kept sample in milliseconds: 0.1 us, far below the clock's jitter.
SAMPLE_DECIMALS = 4


@dataclass
class Distribution:
    """Order statistics of one per-step quantity (all in the unit the field name gives).

    ``median_low``/``median_high`` bound the median at 95% confidence (order statistics; ``None`` with fewer
    than 6 values), so a reader can tell a real change of the median from noise.
    """

    count: int
    mean: float
    median: float
    p90: float
    min: float
    max: float
    p10: float | None = None
    median_low: float | None = None
    median_high: float | None = None

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution | None:
        """Summarise ``values``; ``None`` when there are none (absent, never zero)."""
        if not values:
            return None
        ordered = sorted(values)
        interval = median_interval(ordered)
        return cls(
            count=len(ordered),
            mean=statistics.fmean(ordered),
            median=statistics.median(ordered),
            p90=percentile(ordered, 90.0),
            min=ordered[0],
            max=ordered[-1],
            p10=percentile(ordered, 10.0),
            median_low=float(interval[0]) if interval else None,
            median_high=float(interval[1]) if interval else None,
        )


def thinned(values: Sequence[float], limit: int = MAX_SAMPLES) -> list[float]:
    """At most ``limit`` of ``values``, evenly spaced and in order (a run's drift stays visible), rounded."""
    step = max(1, math.ceil(len(values) / limit))
    return [round(v, SAMPLE_DECIMALS) for v in values[::step]]


def percentile(ordered: Sequence[float], pct: float) -> float:
    """Linear-interpolated percentile of already sorted values (numpy's default method)."""
    if not ordered:
        raise ConfigError("percentile of an empty sequence")
    rank = (len(ordered) - 1) * pct / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class TimingSummary:
    """Per-batch timing of the training loop (see ``lightning_perf.collect.steps.step_clock``)."""

    steps: int = 0
    samples: int = 0
    step_time_ms: Distribution | None = None
    data_wait_ms: Distribution | None = None
    compute_ms: Distribution | None = None
    # share of the summed step time spent blocked on the DataLoader, and its 95% interval (bootstrap)
    data_wait_pct: float | None = None
    data_wait_pct_low: float | None = None
    data_wait_pct_high: float | None = None
    samples_per_sec: float | None = None
    batches_per_sec: float | None = None
    # the first fetch of every epoch (worker start-up), kept apart from the per-batch wait
    epoch_start_ms: Distribution | None = None
    epochs: int = 0
    # wall time spent outside training steps: validation during fit, checkpoint saving
    validation_s: float = 0.0
    checkpoint_s: float = 0.0
    # wall time from the first training batch to the end of training
    train_wall_s: float = 0.0
    # On CUDA, from events recorded at each batch boundary (lightning_perf.collect.cuda_events): the time the
    # GPU had no work while the DataLoader fetched, and GPU time per step; ``gpu_data_wait_pct`` is the
    # former's share of GPU step time. Absent off CUDA or when no pair of events had completed.
    gpu_data_wait_ms: Distribution | None = None
    gpu_compute_ms: Distribution | None = None
    gpu_data_wait_pct: float | None = None
    # Why a fetch is late with 0 workers (the loading runs in the training thread's fetch): the wall time and the
    # thread's CPU time (``time.thread_time``) of the sampled fetches, every 8th batch, ``fetches_sampled`` of them.
    # CPU time close to the wall time: the loading computes; well below it: it waits (storage, sleep, a lock).
    fetch_wall_ms: float = 0.0
    fetch_cpu_ms: float = 0.0
    fetches_sampled: int = 0
    # The same thread's run-queue time (runnable, waiting for a core: Linux schedstat) in the same fetches, and
    # their wall time: a fetch that waits for a core computes, it does not wait on storage.
    fetch_runqueue_ms: float = 0.0
    fetch_runqueue_wall_ms: float = 0.0
    fetches_runqueue_sampled: int = 0
    # per-step samples in step order (at most MAX_SAMPLES, evenly thinned): step time and its DataLoader wait
    step_samples_ms: list[float] = field(default_factory=list)
    wait_samples_ms: list[float] = field(default_factory=list)
    # None: every step was kept and the distributions are exact. A run longer than the exact bound
    # (lightning_perf.collect.steps.step_history) has medians and percentiles from a quantile sketch, each within this
    # relative error of the exact value (means, counts, minimum and maximum stay exact).
    sketch_relative_accuracy: float | None = None


@dataclass
class GpuUtilization:
    """GPU figures averaged over the run (NVML) and over profiled windows (kernel-busy from traces)."""

    device_name: str | None = None
    util_pct: float | None = None
    mem_util_pct: float | None = None
    mem_used_gb: float | None = None
    peak_mem_used_gb: float | None = None
    power_w: float | None = None
    kernel_busy_pct: float | None = None
    # the same without communication kernels (NCCL/RCCL waiting for a peer is not work)
    compute_busy_pct: float | None = None
    compute_capability: list[int] | None = None


@dataclass
class CpuUtilization:
    """Host figures averaged over the run (psutil). Percentages are of one core (100 = one core busy)."""

    process_cpu_pct: float | None = None
    workers_cpu_pct: float | None = None
    system_cpu_pct: float | None = None
    process_rss_gb: float | None = None
    workers_rss_gb: float | None = None
    num_workers_seen: int | None = None
    cpu_count: int | None = None
    # Why the DataLoader workers are late, summed over the workers alive between the sampler's kept reads:
    # seconds of wall time, of CPU time (the OS's), and of waiting for a core while runnable (Linux
    # /proc/<pid>/schedstat of each worker's main thread; None where not readable). Wall time not spent on a CPU
    # nor in the run queue is waiting: storage, network, sleep, locks, or an empty task queue.
    workers_wall_s: float | None = None
    workers_cpu_s: float | None = None
    workers_runqueue_s: float | None = None


@dataclass
class UtilizationSummary:
    gpu: GpuUtilization | None = None
    # why GPU figures are absent ("no GPU", "NVML not installed", ...); None when they are present
    gpu_unavailable_reason: str | None = None
    cpu: CpuUtilization | None = None
    # readings NVML cannot give on the device in use (e.g. utilization on a MIG instance), with its answer
    gpu_metrics_unavailable: dict[str, str] = field(default_factory=dict)


@dataclass
class MachineState:
    """What else the machine did while the run measured (see ``lightning_perf.collect.sampling.machine_state``).

    ``other_cores`` is CPU time used by other processes (the whole machine's busy time minus this process and
    its children, e.g. DataLoader workers) per second of the run, in cores; ``steal_pct`` is the share of CPU
    time the hypervisor gave to other guests; ``load_avg_1m`` is the 1-minute load average at the end.
    The GPU side comes from the NVML samples taken during training steps: ``gpu_sm_clock_mhz`` the average SM
    clock (of the slowest GPU in use) against ``gpu_sm_clock_max_mhz``, and ``gpu_slowdown_pct`` the share of
    samples (%) in which each clock slowdown reason (power cap, thermal limit, ...) held the clocks down.
    """

    wall_s: float | None = None
    cpu_count: int | None = None
    own_cores: float | None = None
    other_cores: float | None = None
    steal_pct: float | None = None
    # the share (%) of the run's wall time the training thread was runnable but waited for a core (Linux
    # schedstat): other processes holding the cores the run needs, measured where it costs the run
    train_thread_runqueue_pct: float | None = None
    load_avg_1m: float | None = None
    cpu_freq_mhz: float | None = None
    cpu_freq_max_mhz: float | None = None
    gpu_sm_clock_mhz: float | None = None
    gpu_sm_clock_max_mhz: float | None = None
    gpu_slowdown_pct: dict[str, float] = field(default_factory=dict)


@dataclass
class Settings:
    """The settings fingerprint: what the run ran with, so two runs can be compared."""

    num_workers: int | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None
    prefetch_factor: int | None = None
    batch_size: int | None = None
    cudnn_benchmark: bool | None = None
    cudnn_deterministic: bool | None = None
    precision: str | None = None
    accelerator: str | None = None
    devices: int | None = None
    world_size: int | None = None
    strategy: str | None = None
    accumulate_grad_batches: int | None = None
    torch_version: str | None = None
    lightning_version: str | None = None
    cuda_version: str | None = None
    gpu_name: str | None = None
    cpu_count: int | None = None
    host: str | None = None
    model_has_conv: bool | None = None
    input_shapes_vary: bool | None = None
    # the training device's compute capability from torch (e.g. [8, 0]), with NVML on or off
    compute_capability: list[int] | None = None
    # torch.get_float32_matmul_precision(): "highest" (fp32), "high"/"medium" (TF32/bf16 tensor cores)
    float32_matmul_precision: str | None = None
    # torch.backends.cuda.matmul.allow_tf32 / torch.backends.cudnn.allow_tf32
    matmul_allow_tf32: bool | None = None
    cudnn_allow_tf32: bool | None = None
    # the DataLoader already yields CUDA tensors (GPU-side decoding, a dataset on the GPU)
    loader_yields_cuda: bool | None = None
    # how often validation runs, as the user set it, so advice can use the user's own terms
    val_check_interval: float | int | None = None
    check_val_every_n_epoch: int | None = None
    limit_val_batches: float | int | None = None
    max_epochs: int | None = None
    train_batches_per_epoch: int | None = None


@dataclass
class Finding:
    """One diagnosis of a run.

    Args:
        id: the rule's stable id (e.g. ``input_bound``, ``low_mfu``).
        severity: ``high``, ``medium`` or ``low``.
        title: one line, what is wrong.
        evidence: the measured figures it rests on.
        recommendation: what to do.
        settings_change: the settings to change, keyed by where they live (e.g. ``data.num_workers``); only
            values a measurement backs.
        verdict: the input-bound finding's grade.
    """

    id: str
    severity: str
    title: str
    evidence: str
    recommendation: str
    settings_change: dict[str, Any] = field(default_factory=dict)
    # the input-bound finding's grade, one of rules.thresholds.VERDICTS, read where the verdict is shown (never
    # its title, whose words may change); None on other findings, on a run too short for a grade, and in
    # summaries written before the field (rules.inputs.waiting.verdict_of reads their titles)
    verdict: str | None = None


@dataclass
class TraceFile:
    path: str
    steps: list[int] = field(default_factory=list)
    bytes: int = 0


@dataclass
class RankStats:
    """One rank's figures for the per-rank table of a distributed run."""

    rank: int
    host: str
    step_time_ms: float | None = None
    data_wait_ms: float | None = None
    gpu_util_pct: float | None = None
    cpu_util_pct: float | None = None
    # the node's index in the job (Lightning's node_rank); None in summaries written before it was recorded
    node_rank: int | None = None


@dataclass
class RunSummary:
    """Everything one run measured, as ``PerfCallback`` writes it to ``perf_summary.json``.

    ``to_dict``/``from_dict`` round-trip through the file; ``from_dict`` reads the summaries of earlier versions
    too. Its sections: ``timing`` (steps, data wait), ``utilization``, ``settings``, ``probes`` (the measured
    experiments after the fit), the step ``anatomy``, ``compute_limit`` (FLOPs and MFU), ``machine`` and ``findings``.

    Raises:
        SummaryError: (from ``from_dict``) a file that is not a summary, or one of a newer schema.
    """

    run_name: str = ""
    log_dir: str | None = None
    stage: str = "fit"
    status: str = "finished"
    started_at: str | None = None
    ended_at: str | None = None
    global_rank: int = 0
    world_size: int = 1
    timing: TimingSummary = field(default_factory=TimingSummary)
    utilization: UtilizationSummary = field(default_factory=UtilizationSummary)
    settings: Settings = field(default_factory=Settings)
    findings: list[Finding] = field(default_factory=list)
    traces: list[TraceFile] = field(default_factory=list)
    ranks: list[RankStats] = field(default_factory=list)
    # the global ranks that record torch profiler traces in this job (``trace_ranks``); empty without profiling
    trace_ranks: list[int] = field(default_factory=list)
    # results of the probes measured after the last step (num_workers sweep, a worker's hand-off, cudnn.benchmark A/B)
    probes: Probes = field(default_factory=Probes)
    # what each profiled cycle with CUDA activity shows (traces.gpu_figures), in the order recorded
    trace_figures: list[TraceFigures] = field(default_factory=list)
    # the machine's state during the run; None when it could not be read
    machine: MachineState | None = None
    # process RSS and GPU allocator memory over the training steps (the utilization sampler); None without it
    memory: MemorySeries | None = None
    # torch.compile's compilations during the fit (analysis.compile_summary); None when nothing was compiled
    compile: CompileSummary | None = None
    # lasting rises of the step time found over the logging windows (analysis.changepoint), in run order
    slowdowns: list[Slowdown] = field(default_factory=list)
    # a step's FLOPs, the device's peak and the MFU (analysis.compute_limit); None when no FLOPs were known
    compute_limit: ComputeLimit | None = None
    # the mean training step in parts: forward, backward, callbacks, ... (analysis.compute.anatomy)
    anatomy: StepAnatomy | None = None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["probes"] = self.probes.to_dict()  # the probes that ran, each under its name (as always written)
        return {"schema": SCHEMA_NAME, "schema_version": SCHEMA_VERSION, **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<dict>") -> RunSummary:
        if not isinstance(data, dict) or data.get("schema") != SCHEMA_NAME:
            raise SummaryError(f"{source}: not a lightning-perf run summary (no schema {SCHEMA_NAME!r})")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise SummaryError(
                f"{source}: summary schema_version {version!r} is not supported (this version reads "
                f"{SCHEMA_VERSION})"
            )
        payload = {k: v for k, v in data.items() if k not in ("schema", "schema_version")}
        try:
            return build(cls, payload)
        except FieldError as err:  # names the field: "timing.step_time_ms: missing count, mean, median"
            raise SummaryError(f"{source}: malformed run summary: {err}") from None

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write atomically, so a crash mid-write never leaves a truncated summary behind."""
        path = os.fspath(path)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with atomic_open(path) as fh:
            json.dump(self.to_dict(), fh, indent=2, allow_nan=False, default=_json_default)
            fh.write("\n")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> RunSummary:
        """Read ``perf_summary.json`` (or the one in a dir). :class:`SummaryError` naming the file (and the
        field) for a missing, oversized, corrupt or impossible summary (NaN, infinite or negative figures)."""
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, SUMMARY_FILENAME)
        try:
            with open(path, "rb") as fh:
                raw = fh.read(MAX_SUMMARY_BYTES + 1)
        except FileNotFoundError as err:
            raise SummaryError(f"{path}: no run summary here (expected {SUMMARY_FILENAME})") from err
        except OSError as err:
            raise SummaryError(f"{path}: cannot read the run summary: {err.strerror or err}") from err
        if len(raw) > MAX_SUMMARY_BYTES:
            raise SummaryError(f"{path}: over {MAX_SUMMARY_BYTES >> 20} MiB, not a run summary")
        try:
            data = json.loads(raw.decode("utf-8"))
        except RecursionError:
            raise SummaryError(f"{path}: corrupt run summary: JSON nested too deeply") from None
        except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError, over-long integers, NaN
            raise SummaryError(f"{path}: corrupt or truncated run summary: {err}") from None
        if isinstance(data, dict):
            for key, value in data.items():
                _check_numbers(value, key, path, measured=key in _MEASURED_SECTIONS)
        return cls.from_dict(data, source=path)


def _check_numbers(value: Any, where: str, path: str, measured: bool, depth: int = 1) -> None:
    """No number is NaN or infinite (we write strict JSON); a measured one (a time, rate, percentage or
    size) is also >= 0; nothing nests deeper than a summary can. The error names the file and the field."""
    if depth > MAX_SUMMARY_DEPTH and isinstance(value, (dict, list)):
        raise SummaryError(
            f"{path}: corrupt run summary: {where} nests deeper than {MAX_SUMMARY_DEPTH} levels"
        )
    if isinstance(value, dict):
        for key, item in value.items():
            _check_numbers(item, f"{where}.{key}", path, measured, depth + 1)
    elif isinstance(value, list):
        for index in suspects(value, measured):  # a million plain samples are not looked at one call each
            _check_numbers(value[index], f"{where}[{index}]", path, measured, depth + 1)
    elif isinstance(value, float) and not math.isfinite(value):
        raise SummaryError(f"{path}: corrupt run summary: {where} is {value!r}, expected a finite number")
    elif measured and isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
        raise SummaryError(f"{path}: corrupt run summary: {where} is {value!r}, expected a number >= 0")


def _json_default(value: Any) -> Any:
    # numpy scalars and the like reach the summary from probes; store them as plain numbers
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
