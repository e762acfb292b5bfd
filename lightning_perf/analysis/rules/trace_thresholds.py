"""The named thresholds of the trace rules (``rules_trace``), each with where its number comes from."""

from __future__ import annotations

# torch-tb-profiler 0.4.3 (profiler/data.py _analyze_gpu_metrics) calls a GPU "low utilization" below 50% kernel
# time: idle above half of the profiled steps is a high finding. Our medium line: a quarter of the step idle,
# the share HTA's temporal breakdown examples flag as worth the idle-time breakdown.
GPU_IDLE_HIGH_PCT = 50.0
GPU_IDLE_MEDIUM_PCT = 25.0
# Host-blocking calls (synchronize, blocking copies) over this share of the step, while the GPU idles: the
# input-bound lines of TensorFlow's analyzer (5% moderate, 20% high) applied to the other thing the host waits on.
HOST_SYNC_MEDIUM_PCT = 5.0
HOST_SYNC_HIGH_PCT = 20.0
# A wait only costs when the GPU starves meanwhile: at least this share of the step idle. Our choice: below it a
# blocked host is back-pressure from a full launch queue (GPU-bound), not a stall.
HOST_SYNC_MIN_IDLE_PCT = 10.0
# Launch-bound: host time in launch calls above the kernel time they launch, with most kernels tiny
# (SMALL_KERNEL_US in traces.gpu_figures) and the GPU idle at least GPU_IDLE_MEDIUM_PCT of the step (NVIDIA,
# "Getting Started with CUDA Graphs": launch overhead dominates when kernels run for a few microseconds).
LAUNCH_BOUND_SMALL_KERNEL_PCT = 50.0
# Pageable host-to-device copies: any is worth pin_memory (torch-tb-profiler's and PyTorch's "pin memory"
# guidance); above this share of the step it is a medium finding. Our choice: TensorFlow's 5% "visible" line.
PAGEABLE_MEMCPY_MEDIUM_PCT = 5.0
# torch-tb-profiler recommends AMP when kernels of tensor-core-eligible operators run and none uses tensor cores
# (profiler/data.py). "Most kernel time" is our line for medium; any share at all gives a low finding.
MIXED_PRECISION_MEDIUM_PCT = 50.0
MIXED_PRECISION_LOW_PCT = 10.0
# torch-tb-profiler: communication above 10% of the step is "high time cost on communication"
# (profiler/data.py _analyze_distributed_metrics); we count only the part no compute hides. High above 25%.
EXPOSED_COMM_MEDIUM_PCT = 10.0
EXPOSED_COMM_HIGH_PCT = 25.0
# Allocated memory rising in every step but at most one, by at least this much a step, is a leak (PyTorch FAQ,
# "My model reports cuda runtime error(2): out of memory": accumulating history across the training loop).
# Our choice: 1 MB a step is far above the allocator's rounding (512 B blocks, 2 MB segments).
MEMORY_GROWTH_MIN_MB_PER_STEP = 1.0
# torch-tb-profiler: peak memory above 90% of the device is "at the limit" (profiler/data.py analyze).
MEMORY_NEAR_CAPACITY_PCT = 90.0
# Far below capacity: room for a larger batch. Our choice: under half the device.
MEMORY_ROOM_PCT = 50.0
