"""Every metric lightning-perf logs, in one registry: tag, unit, meaning, group and when it is written.

The step clock, the utilization sampler, the cross-rank exchange, the HParams writer, the Custom Scalars layout,
``lightning-perf compare`` and the metric table of docs/metrics.md all read their names from here.

Tags are grouped so that TensorBoard shows each group as a section of its own: TensorBoard puts a scalar in the
section named by the part of its tag before the first ``/`` (``tag.split("/", 1)[0]`` in its dashboard), so
``perf_step/time_ms`` lands in ``perf_step`` beside ``perf_step/compute_ms`` while ``perf_data/wait_pct`` gets a
section of its own.

Three kinds of metric:

- ``window``: one point per logging window (``log_every_n_steps`` batches) at ``trainer.global_step``, through
  every logger of the Trainer;
- ``summary``: once at the end of ``fit``, the figures ``lightning-perf compare`` compares; they are the HParams
  tab's metrics (TensorBoard's HParams tab reads its metric values from scalars, so they are written as scalars
  too, in the ``perf_summary`` section only);
- ``text``: Markdown in TensorBoard's Text tab (the diagnosis, the num_workers probe as a table).

Pure: no Lightning, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["window", "summary", "text", "image"]

# the suffix of the slowest rank's value under DDP (the un-suffixed tag is then the mean over ranks)
MAX_SUFFIX = "_max"


@dataclass(frozen=True)
class Metric:
    """One logged metric."""

    group: str  # the TensorBoard section is ``perf_<group>``
    name: str  # the tag within the group
    unit: str
    meaning: str
    kind: Kind = "window"
    # under DDP: exchanged between ranks, logged as the mean, ``<tag>_max`` and feeding the slowest rank
    across_ranks: bool = False
    # the Custom Scalars chart that draws it beside related metrics of the same unit (its title says which), if any
    chart: str | None = None
    # summaries: the label and the better direction ("lower"/"higher"/None) in ``lightning-perf compare``
    label: str = ""
    better: str | None = None
    # when it is written, where that is not at the end of fit (the metric table's "logged" column)
    when: str = ""

    @property
    def tag(self) -> str:
        return f"perf_{self.group}/{self.name}"

    @property
    def key(self) -> str:
        """The name inside the group, which is also a summary metric's key in ``compare``'s JSON."""
        return self.name


def _w(
    group: str,
    name: str,
    unit: str,
    meaning: str,
    *,
    across_ranks: bool = False,
    chart: str | None = None,
    when: str = "",
) -> Metric:
    return Metric(group, name, unit, meaning, "window", across_ranks=across_ranks, chart=chart, when=when)


def _s(name: str, label: str, unit: str, better: str | None, meaning: str) -> Metric:
    return Metric("summary", name, unit, meaning, "summary", label=label, better=better)


STEP_TIME = _w(
    "step",
    "time_ms",
    "ms",
    "mean wall time of a training step: from the start of one batch's fetch to the next; validation, "
    "checkpointing and epoch boundaries are left out",
    across_ranks=True,
    chart="step time (ms)",
)
COMPUTE = _w(
    "step",
    "compute_ms",
    "ms",
    "step time minus DataLoader wait: forward, backward, optimizer, transfers, hooks",
    across_ranks=True,
    chart="step time (ms)",
)
SAMPLES_PER_SEC = _w(
    "step",
    "samples_per_sec",
    "1/s",
    "samples (first dimension of the batch's first tensor, or `batch_size=`) per second of step time",
    across_ranks=True,
    chart="throughput (samples/s)",
)
BATCHES_PER_SEC = _w(
    "step", "batches_per_sec", "1/s", "batches per second of step time", chart="throughput (batches/s)"
)
DATA_WAIT = _w(
    "data",
    "wait_ms",
    "ms",
    "mean time the training loop was blocked in `next(data_fetcher)`, i.e. waiting for the DataLoader "
    "(host-to-device copy, callbacks and logging excluded)",
    across_ranks=True,
    chart="DataLoader wait (ms)",
)
DATA_WAIT_PCT = _w(
    "data",
    "wait_pct",
    "%",
    "DataLoader wait as a share of step time in the window, measured on the host; on a GPU it overstates the "
    "GPU's wait when nothing syncs per step (see perf_gpu/data_wait_pct)",
    across_ranks=True,
    chart="DataLoader wait (% of step time)",
)
EPOCH_START = _w(
    "data",
    "epoch_start_ms",
    "ms",
    "the latest epoch's first fetch (iterator creation, worker start-up), kept out of the per-batch wait",
)
GPU_UTIL = _w(
    "gpu",
    "util_pct",
    "%",
    "NVML utilization: share of time a kernel was running on the GPU, averaged over the samples taken during "
    "training steps (not validation, checkpoints or epoch starts)",
    across_ranks=True,
    chart="GPU busy (% of time)",
)
GPU_MEM_UTIL = _w("gpu", "mem_util_pct", "%", "NVML memory-controller utilization")
GPU_MEM_USED = _w("gpu", "mem_used_gb", "GB (1e9 B)", "device memory in use (NVML: all processes on the GPU)")
GPU_POWER = _w("gpu", "power_w", "W", "board power draw, where NVML reports it")
GPU_SM_CLOCK = _w(
    "gpu",
    "sm_clock_mhz",
    "MHz",
    "SM clock, averaged over the samples; below the device's maximum when a power cap or heat held it down "
    "(the summary's machine state names the reason and its share of the run)",
)
KERNEL_BUSY = _w(
    "gpu",
    "kernel_busy_pct",
    "%",
    "per profiled cycle with CUDA activity: share of the profiled steps in which at least one kernel ran "
    '(overlaps merged), torch-tb-profiler\'s "GPU Utilization"',
    chart="GPU busy (% of time)",
)
COMPUTE_BUSY = _w(
    "gpu",
    "compute_busy_pct",
    "%",
    "per profiled cycle with CUDA activity: kernel-busy counting compute kernels only (communication kernels "
    "such as NCCL's are not busy work: a rank waiting on a straggler is idle)",
    chart="GPU busy (% of time)",
)
GPU_DATA_WAIT = _w(
    "gpu",
    "data_wait_ms",
    "ms",
    "on CUDA: mean time the GPU sat idle across the batch fetch, from CUDA events at batch boundaries "
    '(the GPU-side truth behind the host\'s data wait: the "is my GPU waiting for data?" number)',
    across_ranks=True,
    chart="DataLoader wait (ms)",
)
GPU_DATA_WAIT_PCT = _w(
    "gpu",
    "data_wait_pct",
    "%",
    "on CUDA: that idle time as a share of the GPU's step",
    across_ranks=True,
    chart="DataLoader wait (% of step time)",
)
GPU_COMPUTE = _w(
    "gpu",
    "compute_ms",
    "ms",
    "on CUDA: mean GPU time per step between batch-boundary events",
    across_ranks=True,
)
CPU_UTIL = _w(
    "cpu",
    "process_pct",
    "% of one core",
    "the training process (200 = two cores busy)",
    across_ranks=True,
    chart="CPU (% of one core)",
)
WORKERS_CPU = _w(
    "cpu",
    "workers_pct",
    "% of one core",
    "all DataLoader worker processes together: near `100 x num_workers` means a CPU-bound input pipeline",
    chart="CPU (% of one core)",
)
SYSTEM_CPU = _w("cpu", "system_pct", "% of all cores", "the whole machine")
PROCESS_RSS = _w("cpu", "process_rss_gb", "GB", "resident memory of the training process")
WORKERS_RSS = _w(
    "cpu",
    "workers_rss_gb",
    "GB",
    "resident memory of the DataLoader workers, summed (pages shared with the training process count once per "
    "worker)",
)
SLOWEST_RANK = _w(
    "ranks",
    "slowest_rank",
    "rank",
    "under DDP: the rank with the longest DataLoader wait (step time breaks ties)",
)
COMPILE_TIME = _w(
    "compile",
    "time_s",
    "s",
    "torch.compile: seconds spent compiling in the window (dynamo and its backend, recompiles included); logged "
    "from the first compilation on, so 0 is a window that compiled nothing",
)
RECOMPILES = _w(
    "compile", "recompiles", "count", "torch.compile: recompilations in the window (a guard failed)"
)
# the step's anatomy (analysis.compute.anatomy), each part's mean ms a step in the window (the wait: perf_data)
ANATOMY_MEANINGS = {
    "transfer": "the batch's way to the device: `batch_to_device` and the batch-transfer hooks",
    "forward": "`training_step` (the strategy's, with the module's `self.log` calls)",
    "zero_grad": "`optimizer_zero_grad`",
    "backward": "the backward pass (`strategy.backward`, less the backward hooks inside it)",
    "optimizer": "`optimizer_step` less the closure's forward and backward: optimizer, clipping, LR scheduler",
    "module_hooks": "the LightningModule's and DataModule's own hooks of the step (`on_train_batch_end`, ...)",
    "callbacks": "the Trainer's callbacks' hooks of the step, the progress bar and lightning-perf apart",
    "progress_bar": "the progress bar's hooks",
    "loggers": "the loggers' `log_metrics` and `save` (lightning-perf's own window excluded)",
    "lightning_perf": "lightning-perf's own hooks (its windows' logging excluded, as from the step time)",
    "loop": "what the hooks leave of the step: Lightning's loop, the logger connector, the fetcher's glue",
}
ANATOMY = tuple(
    _w("anatomy", f"{part}_ms", "ms", meaning, chart="step anatomy (ms a step)")
    for part, meaning in ANATOMY_MEANINGS.items()
)

MFU = _w(
    "compute",
    "mfu_pct",
    "%",
    "model FLOPs utilization: a step's FLOPs (counted once a fit, or `flops_per_batch`) per second of the step, "
    "as a share of the device's measured matmul peak in the run's dtype (`compute_limit` in perf_summary.json)",
    when="end of fit: one point a step",
)

# the figures `lightning-perf compare` compares, once per run: also the HParams tab's metrics
STEP_TIME_MEAN = _s(
    "step_time_mean_ms",
    "mean step time",
    "ms",
    "lower",
    "mean step time over every step of the run: the headline `compare` and `trial` judge",
)
STEP_TIME_MEDIAN = _s(
    "step_time_median_ms", "median step time", "ms", "lower", "median step time over every step of the run"
)
STEP_TIME_P90 = _s("step_time_p90_ms", "p90 step time", "ms", "lower", "90th percentile of the step time")
SUMMARY_DATA_WAIT = _s(
    "data_wait_pct", "data wait", "%", "lower", "DataLoader wait as a share of the run's step time"
)
SUMMARY_THROUGHPUT = _s(
    "samples_per_sec", "throughput", "samples/s", "higher", "samples per second of step time over the run"
)
SUMMARY_GPU_UTIL = _s("gpu_util_pct", "GPU util", "%", "higher", "the run's mean NVML GPU utilization")
SUMMARY_KERNEL_BUSY = _s(
    "kernel_busy_pct", "kernel busy", "%", "higher", "mean kernel-busy share of the profiled cycles"
)
SUMMARY_PEAK_GPU_MEM = _s(
    "peak_gpu_mem_gb", "peak GPU memory", "GB", None, "the most device memory in use on any GPU"
)
SUMMARY_PROCESS_CPU = _s(
    "process_cpu_pct", "process CPU", "%", None, "the training process's mean CPU, % of one core"
)

DIAGNOSIS_TEXT = Metric("text", "diagnosis", "", "the findings with evidence and recommendations", "text")
PROBE_TEXT = Metric(
    "text",
    "num_workers_probe",
    "",
    "the num_workers probe as a table: batches/s delivered per num_workers beside the model's rate",
    "text",
)
EVENTS_TEXT = Metric(
    "text",
    "events",
    "",
    "during the run: each lasting slowdown detected and each extra profiler cycle (slowdown, capture) recorded",
    "text",
)
TRACE_CHART = Metric(
    "images",
    "trace_breakdown",
    "",
    "per CUDA cycle: the per-step time breakdown (stacked bars) and the GPU timeline's idle/compute/non-compute",
    "image",
)
# written by `lightning-perf compare` and `trial` into their own TensorBoard run (`perf_compare`), in the same
# sections as a run's text and images
COMPARISON_TEXT = Metric(
    "text",
    "comparison",
    "",
    "the comparison as Markdown: verdict, method, settings and hyperparameters that differ, each metric per run",
    "text",
    when="compare / trial: Text tab",
)
COMPARISON_CHART = Metric(
    "images",
    "comparison_chart",
    "",
    "the comparison's bar chart of the headline metrics, one panel a metric",
    "image",
    when="compare / trial: Images tab",
)

# in the order of the metric table (docs/metrics.md)
METRICS: tuple[Metric, ...] = (
    STEP_TIME,
    COMPUTE,
    SAMPLES_PER_SEC,
    BATCHES_PER_SEC,
    DATA_WAIT,
    DATA_WAIT_PCT,
    EPOCH_START,
    GPU_UTIL,
    GPU_MEM_UTIL,
    GPU_MEM_USED,
    GPU_POWER,
    GPU_SM_CLOCK,
    KERNEL_BUSY,
    COMPUTE_BUSY,
    GPU_DATA_WAIT,
    GPU_DATA_WAIT_PCT,
    GPU_COMPUTE,
    CPU_UTIL,
    WORKERS_CPU,
    SYSTEM_CPU,
    PROCESS_RSS,
    WORKERS_RSS,
    SLOWEST_RANK,
    COMPILE_TIME,
    RECOMPILES,
    *ANATOMY,
    MFU,
    STEP_TIME_MEAN,
    STEP_TIME_MEDIAN,
    STEP_TIME_P90,
    SUMMARY_DATA_WAIT,
    SUMMARY_THROUGHPUT,
    SUMMARY_GPU_UTIL,
    SUMMARY_KERNEL_BUSY,
    SUMMARY_PEAK_GPU_MEM,
    SUMMARY_PROCESS_CPU,
    DIAGNOSIS_TEXT,
    PROBE_TEXT,
    EVENTS_TEXT,
    TRACE_CHART,
    COMPARISON_TEXT,
    COMPARISON_CHART,
)
WINDOW_METRICS = tuple(m for m in METRICS if m.kind == "window")
SUMMARY_METRICS = tuple(m for m in METRICS if m.kind == "summary")
ACROSS_RANKS = tuple(m for m in METRICS if m.across_ranks)

# tags of 0.1.0, before the regrouping into TensorBoard sections: CHANGELOG's migration note lists these
RENAMED_FROM = {
    "perf/step_time_ms": STEP_TIME,
    "perf/compute_ms": COMPUTE,
    "perf/samples_per_sec": SAMPLES_PER_SEC,
    "perf/batches_per_sec": BATCHES_PER_SEC,
    "perf/data_wait_ms": DATA_WAIT,
    "perf/data_wait_pct": DATA_WAIT_PCT,
    "perf/epoch_start_ms": EPOCH_START,
    "perf/gpu_util_pct": GPU_UTIL,
    "perf/gpu_mem_util_pct": GPU_MEM_UTIL,
    "perf/gpu_mem_used_gb": GPU_MEM_USED,
    "perf/gpu_power_w": GPU_POWER,
    "perf/gpu_kernel_busy_pct": KERNEL_BUSY,
    "perf/cpu_util_pct": CPU_UTIL,
    "perf/dataloader_workers_cpu_pct": WORKERS_CPU,
    "perf/system_cpu_pct": SYSTEM_CPU,
    "perf/process_rss_gb": PROCESS_RSS,
    "perf/workers_rss_gb": WORKERS_RSS,
    "perf/slowest_rank": SLOWEST_RANK,
    "perf/diagnosis": DIAGNOSIS_TEXT,
    "perf/comparison": COMPARISON_TEXT,
    "perf/comparison_chart": COMPARISON_CHART,
    **{f"perf/summary/{m.key}": m for m in SUMMARY_METRICS},
}


def by_tag(tag: str) -> Metric | None:
    return next((m for m in METRICS if m.tag == tag), None)


def summary_metric(key: str) -> Metric:
    """The summary metric whose ``compare`` key is ``key``."""
    return next(m for m in SUMMARY_METRICS if m.key == key)


def max_tag(metric: Metric) -> str:
    """The slowest rank's value of an ``across_ranks`` metric under DDP."""
    return metric.tag + MAX_SUFFIX


def custom_scalars_layout() -> dict[str, dict[str, list]]:
    """TensorBoard's Custom Scalars layout: one chart a metric, every run drawn in it, its unit in its title.

    TensorBoard colours a chart's lines by run, so a chart of two tags drew each run's two lines in one colour
    (6 lines in 3 colours for 3 runs): each chart holds one tag, and a DDP run's slowest rank has a chart of its
    own. The first metric of a ``chart`` group keeps the group's title; the others add their name to it."""
    charts: dict[str, list[str]] = {}
    groups: set[str] = set()
    for m in WINDOW_METRICS:
        if m.chart is None:
            continue
        # the unit stays last in every title: "step time (ms)", "step time: compute (ms)", "step time, slowest
        # rank (ms)"
        what, _, unit = m.chart.rpartition(" (")
        words = m.name.removesuffix("_ms").removesuffix("_pct").replace("_", " ")
        name = what if m.chart not in groups else f"{what}: {words}"
        groups.add(m.chart)
        charts[f"{name} ({unit}"] = ["^" + m.tag + "$"]
        if m.across_ranks:
            charts[f"{name}, slowest rank ({unit}"] = ["^" + max_tag(m) + "$"]
    return {"lightning-perf": {chart: ["Multiline", tags] for chart, tags in charts.items()}}
