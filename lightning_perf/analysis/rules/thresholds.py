"""The diagnosis's named thresholds and vocabulary, each with where its number comes from."""

from __future__ import annotations

# TensorFlow Profiler's input-pipeline analyzer (op_stats_to_input_pipeline_analysis.cc,
# kHighlyInfeedBoundThresholdInPercent / kModeratelyInfeedBoundThresholdInPercent): share of step time
# waiting on input. torch-tb-profiler's single DataLoader rule also fired above 5%.
INPUT_BOUND_HIGH_PCT = 20.0
INPUT_BOUND_MODERATE_PCT = 5.0
# Fewest timed steps for any graded verdict (input-bound or not, and the rules that lean on it): below this the
# diagnosis says the run was too short and what it measured. Timed steps leave out the first batch of every epoch
# (start-up, timed apart) and a trial's warm-up steps. Our choice: torch's DataLoader keeps prefetch_factor=2
# batches a worker in flight, so the first steps after start-up are served from (or starved by) that burst, and
# the wait share's bootstrap interval over fewer steps spans more than a grade; statistics texts take n = 10 as
# the least sample for a normal approximation (the same line as MEMORY_MIN_POINTS below).
MIN_STEPS_FOR_VERDICT = 10
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
# A straggler is a high finding when every other rank loses at least this share of its step waiting for it:
# TensorFlow's "highly input-bound" line (20%), applied to the other thing a step can wait on.
STRAGGLER_HIGH_PCT = 20.0
# Safety margin when estimating num_workers from the measured wait (the probe uses the same margin).
WORKERS_MARGIN = 1.2
# The least a worker's hand-off of one batch costs the training thread (unpickling, the shared-memory file
# descriptors, waking it), where the hand-off was not measured: benchmarks/bench_handoff.py measured 0.67-1.03 ms
# for batches of a few hundred bytes on a 2-core machine; half its lower end allows for faster cores. A 0-worker
# fetch cheaper than this is not moved to a worker by an estimate.
HANDOFF_MAIN_FLOOR_MS = 0.3
# A worker count whose predicted step (the num_workers probe's, or the hand-off model's in rules/inputs/worker_model.py)
# is within this share of the shortest counts as fast as it: the fewest workers among those are advised, and the
# run's own count is kept when it is among them. Our choice: TensorFlow's 5% "visible" line
# (INPUT_BOUND_MODERATE_PCT), below which a difference in step time is not worth a change or more processes.
NEAR_BEST_STEP_PCT = 5.0
# More workers "gain" only when the num_workers probe measured a delivery rate this many times the rate of
# the run's own setting: the same margin the probe asks of a candidate before it says it keeps up.
PROBE_GAIN_MIN = WORKERS_MARGIN
# The training process plus its workers using this share of the usable cores leaves no room for more
# workers. Our choice: a fifth of the cores is under one core on machines of up to 4 cores, too little for a
# worker to run beside the model without taking its time (the 2-core case study measured 86%).
CORES_BUSY_SHARE = 0.8

# Why a batch is late (rules/inputs/loading.py). The loading "waits" when at least half its wall time is spent neither
# on a CPU nor waiting for one (storage, network, a sleep, a lock): a second worker can then fill that time
# without taking a core from the first. Our choice: the midpoint; the loaders we measured sat far from it
# (a sleeping loader 90-99% waiting, per-sample transforms 2-20%).
LOADING_WAITS_SHARE = 0.5
# Fewest sampled fetches (every 8th batch) for the CPU-to-wall share of a run with 0 workers. Our choice: with
# fewer the share rests on one or two batches.
MIN_FETCHES_SAMPLED = 3
# Workers worth having for a loader that waits: as many as fit in the free cores at the CPU share each one was
# measured to use (a worker waiting 97% of its time uses 3% of a core), at most WAITING_WORKERS_MAX. Our choice:
# every worker is a process holding a copy of the dataset object and its prefetched batches, and non-persistent
# ones start again every epoch (tens of ms each); the num_workers probe measures past it where memory allows.
WAITING_WORKERS_MAX = 16
# Other processes "hold the cores this run needs" when, while they used the machine, the training thread was
# runnable but waited for a core this share of the run's wall time (Linux schedstat): the run lost that much to
# them; the same 10% line as a noisy machine (NOISY_OTHER_CPU_SHARE). Or, whatever the run-queue figure, when
# they used this share of all the cores: a thread that mostly sleeps (a loader waiting on storage) is woken
# ahead of CPU hogs and waits little (measured here: 2.6-3.2% with two hogs on the 2 cores), yet its workers,
# transforms and every CPU figure of the run compete with them. Our choice: three quarters, more than one
# single-threaded process can take of a 2-core machine (two hogs measured 1.95 of 2 cores).
BUSY_RUNQUEUE_PCT = 10.0
BUSY_OTHER_CPU_SHARE = 0.75

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
    "drop_last": "DataLoader",
    "dynamic": "torch.compile",
    # compute settings (low_mfu, optimizer_share), applied at run time by `tune -- COMMAND`
    "compile": "torch.compile",
    "matmul_precision": "torch",  # torch.set_float32_matmul_precision
    "channels_last": "memory format",  # of the model and its input batches
    "fused_optimizer": "optimizer",  # fused=True, else foreach=True
}
# the targets whose settings are arguments the user sets (`set num_workers=4`), not code to write
ARGUMENT_TARGETS = ("DataLoader", "Trainer", "ModelCheckpoint")

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

# Memory growth over the sampler's series (rules_memory; the trace's own lines are in trace_thresholds).
# The first share of the steps is warm-up, left out of the fit: the caching allocator's segments, optimizer state
# (created at the first optimizer step), cudnn workspaces, DataLoader pin-memory threads all settle there.
# Our choice: a fifth of the steps, enough for all of these on the runs we measured (they settle in a few steps).
MEMORY_WARMUP_SHARE = 0.2
# Fewest readings after warm-up for a fit. Our choice: Theil-Sen's interval (Sen 1968) uses the normal
# approximation of Kendall's S, which statistics texts accept from n = 10.
MEMORY_MIN_POINTS = 10
# "Monotone-ish": Kendall's tau of memory against step at least this, i.e. three of four pairs of readings in
# step order rise. Our choice: a leak adds at every step, so its pairs are almost all concordant even with noise.
MEMORY_MIN_TAU = 0.5
# Still climbing at the end: the later half's slope at least this share of the whole; a warm-up jump followed by
# a plateau has a later slope near 0. Our choice: half, loose enough for a noisy leak.
MEMORY_LATE_SLOPE_SHARE = 0.5
# Least total growth over the fitted steps worth a finding. Process RSS: glibc keeps freed heap up to its trim
# threshold before returning it, and that threshold rises with the dynamic mmap threshold to at most 2 x 32 MB on
# 64-bit (mallopt(3), M_TRIM_THRESHOLD / M_MMAP_THRESHOLD), so up to 64 MB can be the heap's own slack.
RSS_GROWTH_MIN_MB = 64.0
# GPU: torch.cuda.memory_allocated counts live tensors exactly, but the caching allocator rounds large
# allocations to 2 MiB blocks (PyTorch "CUDA semantics: memory management"). Our choice: 8 such blocks.
GPU_GROWTH_MIN_MB = 16.0
# High when, at the fitted rate, memory runs out within this many times the steps the run has taken: a run ten
# times as long, the usual step from a short trial to the real training, would fail. Our choice.
MEMORY_ETA_HIGH_RUNS = 10.0

# torch.compile (rules_compile). Recompiles costing this share of the training wall time: the same line as
# validation and checkpointing (OVERHEAD_SHARE_PCT), a tenth of the wall time spent on work that trains nothing.
COMPILE_SHARE_PCT = OVERHEAD_SHARE_PCT
# Recompiles after warm-up from this many on are a pattern, not a one-off (a short last batch recompiles once).
# Our choice: two is already a value that keeps changing; dynamo gives up at 8 (torch._dynamo.config.recompile_limit).
RECOMPILES_MEDIUM = 2
# Graph breaks leaving the compiled code in this many graphs or more: each break costs a return to Python and
# a fusion boundary (torch.compile's programming model docs). Our choice: one break (2 graphs) per step function
# is common and cheap, several are a model that is mostly not compiled.
GRAPH_SPLIT_MEDIUM = 4
