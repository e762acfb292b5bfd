"""What one profiler trace shows, as plain figures: the input of the trace rules (``rules_trace``).

Filled by :func:`lightning_perf.traces.figures.gpu_figures.trace_figures` from a trace file; kept here, in the pure
stage, so the rules read numbers, never events. Times are per profiled step in milliseconds, shares in
percent of the step (or of the kernel time where the name says so); ``None`` means "not in this trace".
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class BlockingCall:
    """Runtime calls that held the host until the GPU caught up, totalled by call and issuing operator."""

    name: str  # e.g. cudaStreamSynchronize, cudaMemcpyAsync
    operator: (
        str  # "outermost > innermost" operator around the call, e.g. "aten::item > aten::_local_scalar_dense"
    )
    calls: int
    ms_per_step: float


@dataclass
class MemcpyKind:
    """GPU copies of one kind and memory, e.g. "HtoD (Pageable -> Device)"."""

    kind: str
    calls: int
    ms_per_step: float


@dataclass
class TopOperator:
    """One host operator (self CPU time) or GPU kernel (its duration) of a trace, summed by name."""

    name: str
    calls: int
    ms_per_step: float


@dataclass
class ModuleTime:
    """One module of the model in a profiled cycle, a step's milliseconds: its forward (``nn.Module: <path>``
    spans) and the backward of the autograd nodes its forward created (linked by sequence number), on the host
    and, by the kernels they launched, on the GPU. ``*_self_ms`` leaves its submodules out."""

    path: str
    calls: int = 0  # its forward's calls in the whole cycle
    forward_ms: float = 0.0
    forward_self_ms: float = 0.0
    backward_ms: float = 0.0
    backward_self_ms: float = 0.0
    gpu_forward_ms: float = 0.0
    gpu_backward_ms: float = 0.0
    # the operators called directly in its forward, by their time a step, the costliest first
    top_operators: list[TopOperator] = field(default_factory=list)

    @property
    def self_ms(self) -> float:
        return self.forward_self_ms + self.backward_self_ms

    @property
    def total_ms(self) -> float:
        return self.forward_ms + self.backward_ms


@dataclass
class TraceFigures:
    source: str = ""
    rank: int | None = None
    steps: int = 0
    step_ms: float | None = None
    # torch-tb-profiler's Overview shares (DataLoader, CPU Exec, Kernel, ...), percent of the step
    breakdown_pct: dict[str, float] = field(default_factory=dict)
    # the same categories per step, in ms (the stacked bars of the chart)
    steps_ms: list[dict[str, float]] = field(default_factory=list)
    # each of those steps' number (ProfilerStep#N, the batch index the text shows); None where unknown
    step_numbers: list[int | None] = field(default_factory=list)
    dataloader_pct: float | None = None
    # the DataLoader calls' time a host step (ms), also where GPU work of the previous step hid it (the
    # DataLoader share counts exposed time only): what the ranks are compared on
    dataloader_call_ms: float | None = None
    device_name: str | None = None
    compute_capability: list[int] | None = None
    memory_capacity_gb: float | None = None
    # GPU timeline, HTA's temporal breakdown (percent of the GPU timeline)
    idle_pct: float | None = None
    compute_pct: float | None = None
    non_compute_pct: float | None = None
    # over the profiled steps (first ProfilerStep start .. last ProfilerStep end, aligned to their GPU work)
    kernel_busy_pct: float | None = None
    compute_busy_pct: float | None = None
    step_idle_pct: float | None = None
    # where the host was while the GPU idled inside the steps: share of the idle time per activity
    host_during_idle_pct: dict[str, float] = field(default_factory=dict)
    kernels_per_step: float | None = None
    kernel_ms_per_step: float | None = None
    kernel_median_us: float | None = None
    small_kernel_count_pct: float | None = None
    small_kernel_time_pct: float | None = None
    launches_per_step: float | None = None
    launch_ms_per_step: float | None = None
    communication_ms_per_step: float | None = None
    exposed_communication_ms_per_step: float | None = None
    blocking: list[BlockingCall] = field(default_factory=list)
    blocking_ms_per_step: float | None = None
    memcpy: list[MemcpyKind] = field(default_factory=list)
    pageable_htod_calls: int = 0
    pageable_htod_ms_per_step: float = 0.0
    # percent of all kernel time: counted as matrix-core work (tensor cores, MFMA); launched by tensor-core-eligible
    # operators; those eligible operators' kernels that ran without matrix cores; Triton kernels. Decided by the
    # operators' input types first, kernel names where they cannot tell (analysis.matrix_cores)
    tensor_core_pct: float | None = None
    tc_eligible_pct: float | None = None
    tc_eligible_without_tc_pct: float | None = None
    triton_pct: float | None = None
    # the eligible kernel time by kind and precision, "matmul/bf16", "conv/fp32", "matmul/unknown" (no input
    # types): [percent of all kernel time, the part in kernels whose names are matrix-core kernels]; the rules
    # decide from it again with the run's settings (TF32, the precision of a trace without input types)
    tc_eligible_by: dict[str, list[float]] = field(default_factory=dict)
    # what decided the shares above: "input types", "kernel names", or both, the larger first
    tc_decided_by: str | None = None
    # GPU allocator (profile_memory=True): growth of the allocated bytes per step, peak, and whether the trace
    # gave totals (torch >= 1.10) or only changes (then the peak is relative to the first sample)
    memory_growth_mb_per_step: float | None = None
    memory_growth_steps: int = 0
    memory_peak_gb: float | None = None
    memory_absolute: bool = False
    # the end of fit's answer (output.trace_findings): the operators by self CPU time, the kernels by time
    top_operators: list[TopOperator] = field(default_factory=list)
    top_kernels: list[TopOperator] = field(default_factory=list)
    # the model's modules, the costliest (self time, forward and backward) first (traces.figures.modules)
    modules: list[ModuleTime] = field(default_factory=list)

    def pct_of_step(self, ms_per_step: float | None) -> float | None:
        if ms_per_step is None or not self.step_ms:
            return None
        return 100.0 * ms_per_step / self.step_ms

    @property
    def blocking_pct(self) -> float | None:
        return self.pct_of_step(self.blocking_ms_per_step)

    @property
    def exposed_communication_pct(self) -> float | None:
        return self.pct_of_step(self.exposed_communication_ms_per_step)
