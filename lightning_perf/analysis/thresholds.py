"""The diagnosis's named thresholds and vocabulary, each with where its number comes from."""

from __future__ import annotations

# TensorFlow Profiler's input-pipeline analyzer (op_stats_to_input_pipeline_analysis.cc,
# kHighlyInfeedBoundThresholdInPercent / kModeratelyInfeedBoundThresholdInPercent): share of step time
# waiting on input. torch-tb-profiler's single DataLoader rule also fired above 5%.
INPUT_BOUND_HIGH_PCT = 20.0
INPUT_BOUND_MODERATE_PCT = 5.0
# Worker start-up (first fetch of an epoch) above this share of the epoch is worth persistent workers.
# Our choice: the same 5% TensorFlow uses for "moderately" input-bound, i.e. the point a cost is visible.
EPOCH_START_SHARE_PCT = 5.0
# NVML utilization is the share of time any kernel runs; below half the GPU idles most of the time.
# Our choice (NVIDIA's DCGM guidance treats sustained low utilization as under-use): the GPU idles half the time.
LOW_GPU_UTIL_PCT = 50.0
# Tensor cores: Volta (compute capability 7.0) onwards; bfloat16 needs Ampere (8.0) (CUDA programming guide).
TENSOR_CORE_MIN_CC = 7
BF16_MIN_CC = 8
# Validation or checkpointing above this share of training wall time. Our choice: a tenth of the wall
# time, twice TensorFlow's 5% "visible" line, since validation is useful work, not pure overhead.
OVERHEAD_SHARE_PCT = 10.0
# A worker process busy this share of one core all run long has no slack (psutil: 100 = one core).
# Our choice: "close to 100%" leaving room for sampling noise.
WORKER_SATURATED_PCT = 90.0
# A rank whose step time or data wait exceeds the median of the other ranks by this ratio and gap.
# Our choice: 20% is beyond run-to-run noise of step medians; the gap ignores sub-ms jitter on tiny steps.
STRAGGLER_RATIO = 1.2
STRAGGLER_MIN_GAP_MS = 2.0
# Safety margin when estimating num_workers from the measured wait (the probe uses the same margin).
WORKERS_MARGIN = 1.2
# More workers "gain" only when the num_workers probe measured a delivery rate this many times the rate of
# the run's own setting: the same margin the probe asks of a candidate before it says it keeps up.
PROBE_GAIN_MIN = WORKERS_MARGIN
# The training process plus its workers using this share of the usable cores leaves no room for more
# workers. Our choice: a fifth of the cores is under one core on machines of up to 4 cores, too little for a
# worker to run beside the model without taking its time (the 2-core case study measured 86%).
CORES_BUSY_SHARE = 0.8

SEVERITY_ORDER = ("high", "medium", "low", "info")
VERDICTS = ("highly input-bound", "moderately input-bound", "not input-bound")
FULL_PRECISION = ("32-true", "32")
CUDA_ACCELERATORS = ("cuda", "gpu")
# Where each key of ``Finding.settings_change`` applies, for whoever applies the change.
SETTING_TARGETS = {
    "num_workers": "DataLoader",
    "pin_memory": "DataLoader",
    "persistent_workers": "DataLoader",
    "prefetch_factor": "DataLoader",
    "batch_size": "DataLoader",
    "benchmark": "Trainer",
    "precision": "Trainer",
    "check_val_every_n_epoch": "Trainer",
    "val_check_interval": "Trainer",
    "limit_val_batches": "Trainer",
    "every_n_epochs": "ModelCheckpoint",
    # a named recipe, not an argument: keep samples as uint8 tensors and augment whole batches on the device
    # in `on_after_batch_transfer` (see rules_pipeline.batched_transforms)
    "batched_transforms": "LightningModule",
}

# A machine is "noisy" when other processes took this share of its CPU capacity during the run. pyperf
# (Python's benchmark runner) calls a result unstable when its spread exceeds 10% of the mean; CPU time taken
# by others is the commonest cause, so the same 10% of the machine is the line here.
NOISY_OTHER_CPU_SHARE = 0.10
# Steal time (a hypervisor serving other guests) above this share of CPU time. Our choice: half the line
# above, since steal takes whole time slices from this guest's own CPUs.
NOISY_STEAL_PCT = 5.0
# A GPU whose clocks a slowdown reason (power cap, thermal limit, hardware slowdown) held down in this share of the
# training samples: the same 10% line as the CPU's, since a lowered SM clock slows every kernel in proportion
# (NVIDIA's nvidia-smi documents the reasons; clocks held down in a few samples are within run-to-run spread).
NOISY_GPU_SLOWDOWN_PCT = 10.0
