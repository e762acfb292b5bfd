"""torch-tb-profiler's Overview step breakdown: each ProfilerStep's time split into categories.

See :func:`step_breakdown`. Standard library only. Times are in microseconds, as in the trace.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lightning_perf.traces.intervals import (
    Ranges,
    clipped_length,
    intersect_ranges,
    merge_ranges,
    subtract_ranges,
)
from lightning_perf.traces.reader import USER_ANNOTATION_CAT, is_dataloader_span
from lightning_perf.traces.spans import (
    COMMUNICATION_OP_NAMES,
    KERNEL_CATS,
    MEMCPY_CATS,
    MEMSET_CATS,
    OPERATOR_CATS,
    RUNTIME_CATS,
    Span,
    as_spans,
    is_step,
    step_number,
)

# The Overview categories, in the plugin's display order, and their labels.
CATEGORIES = ("dataloader", "cpu_exec", "kernel", "memcpy", "memset", "communication", "runtime", "other")
CATEGORY_LABELS = {
    "dataloader": "DataLoader",
    "cpu_exec": "CPU Exec",
    "kernel": "Kernel",
    "memcpy": "Memcpy",
    "memset": "Memset",
    "communication": "Communication",
    "runtime": "Runtime",
    "other": "Other",
}
# torch-tb-profiler's ProfileRole order: time covered by several categories goes to the first one here;
# step time covered by none of them is "other". So the categories partition each step.
_PRIORITY = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec")
# event_parser.py _update_steps_duration: the last step with GPU activity is dropped from the Overview when
# it matched fewer than 80% of the previous step's GPU activities (the profiler likely missed some).
_TAIL_STEP_KERNEL_RATIO = 0.8


# What a span is to the breakdown, times two: the odd codes are spans that also mark the host's extent
# (operators and steps), for a trace without ProfilerStep#.
_KERNEL, _MEMCPY, _MEMSET, _RUNTIME, _DATALOADER, _STEP, _COMM_OP, _CPU_EXEC, _NOTHING = range(0, 18, 2)
_KIND_COUNT = 18


def _kind_of(span: Span) -> int:
    cat, name = span.cat, span.name
    if cat in KERNEL_CATS:
        kind = _KERNEL
    elif cat in MEMCPY_CATS:
        kind = _MEMCPY
    elif cat in MEMSET_CATS:
        kind = _MEMSET
    elif cat in RUNTIME_CATS:
        kind = _RUNTIME
    elif is_dataloader_span(name) and not cat.startswith("gpu_"):
        kind = _DATALOADER
    elif is_step(span):
        kind = _STEP
    elif name in COMMUNICATION_OP_NAMES and (cat in OPERATOR_CATS or cat == USER_ANNOTATION_CAT):
        kind = _COMM_OP
    elif cat in OPERATOR_CATS:
        kind = _CPU_EXEC
    else:
        kind = _NOTHING
    return kind + (cat in OPERATOR_CATS or is_step(span))


@dataclass
class StepBreakdown:
    """One step's time per category (microseconds); the categories sum to the step's duration."""

    step: int | None  # None: no ProfilerStep# in the trace, the whole host span as one step (as the plugin)
    start: float
    end: float
    categories: dict[str, float]

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass
class Breakdown:
    steps: list[StepBreakdown] = field(default_factory=list)
    # steps were extended to the GPU work they launched, as torch-tb-profiler does
    device_aligned: bool = False
    # trailing steps dropped because their kernels look incompletely captured (the plugin's rule)
    dropped_tail_steps: int = 0

    def average(self) -> dict[str, float]:
        """Mean per category over the steps, plus ``total`` (the mean step duration). Empty without steps."""
        if not self.steps:
            return {}
        n = len(self.steps)
        avg = {c: math.fsum(s.categories[c] for s in self.steps) / n for c in CATEGORIES}
        avg["total"] = math.fsum(s.duration for s in self.steps) / n
        return avg


def step_breakdown(events: Iterable[Mapping[str, Any] | Span]) -> Breakdown:
    """Each ProfilerStep's time split into torch-tb-profiler's Overview categories (event_parser.py and
    overall_parser.py of torch-tb-profiler 0.4.3), with these deliberate differences for torch 2.x traces:

    - DataLoader spans count whatever their category (the plugin drops user_annotation ones: DataLoader = 0
      unless the trace went through :func:`rewrite_trace`); GPU-side mirrors (gpu_*) are ignored;
    - cuda_runtime / cuda_driver count as Runtime (the plugin only knows the old name "Runtime");
    - kernels whose name starts with "nccl" count as Communication even without a matching nccl:* op;
    - ProfilerStep# mirrors on GPU streams (gpu_user_annotation) are not steps.

    Other user_annotation spans (record_function ranges) are not CPU Exec, as in the plugin: only the
    operators inside them are.
    """
    # the spans grouped by what they are, which depends on (category, name) only: a few hundred pairs decided
    # once each, then one dictionary look-up per span
    # (category -> name -> kind: no key tuple made per span)
    kinds: dict[str, dict[str, int]] = defaultdict(dict)
    groups: list[list[Span]] = [[] for _ in range(_KIND_COUNT)]
    for span in as_spans(events):
        by_name = kinds[span[1]]
        kind = by_name.get(span[0])
        if kind is None:
            kind = by_name[span[0]] = _kind_of(span)
        groups[kind].append(span)

    def group(what: int) -> list[Span]:
        return groups[what] + groups[what + 1]  # without and with the host-extent flag

    kernels, runtimes = group(_KERNEL), group(_RUNTIME)
    device = kernels + group(_MEMCPY) + group(_MEMSET)
    roles: dict[str, Ranges] = {
        role: [(s.start, s.end) for s in group(what)]
        for role, what in (
            ("memcpy", _MEMCPY),
            ("memset", _MEMSET),
            ("runtime", _RUNTIME),
            ("dataloader", _DATALOADER),
            ("communication", _COMM_OP),
            ("cpu_exec", _CPU_EXEC),
        )
    }
    comm_ids = {s.external_id for s in group(_COMM_OP) if s.external_id is not None}
    steps: list[tuple[int | None, float, float]] = [
        (step_number(s.name), s.start, s.end) for s in group(_STEP)
    ]
    host = [s for what in range(1, _KIND_COUNT, 2) for s in groups[what]]  # operators and steps
    cpu_lo = min((s.start for s in host), default=math.inf)
    cpu_hi = max((s.end for s in host), default=-math.inf)
    nccl_names: dict[str, bool] = {}
    roles["kernel"] = []
    for k in kernels:
        nccl = nccl_names.get(k.name)
        if nccl is None:
            nccl = nccl_names[k.name] = k.name.lower().startswith("nccl")
        comm = (k.external_id is not None and k.external_id in comm_ids) or nccl
        roles["communication" if comm else "kernel"].append((k.start, k.end))

    steps.sort(key=lambda s: s[1])
    if not steps and cpu_lo < cpu_hi:
        steps = [(None, cpu_lo, cpu_hi)]
    result = Breakdown()
    if not steps:
        return result
    steps, result.device_aligned, result.dropped_tail_steps = _align_steps_to_device(steps, runtimes, device)

    slots = merge_ranges((start, end) for _, start, end in steps)
    attributed: dict[str, Ranges] = {}
    for role in _PRIORITY:
        attributed[role] = intersect_ranges(slots, merge_ranges(roles[role]))
        slots = subtract_ranges(slots, attributed[role])
    attributed["other"] = slots
    starts = {role: [r[0] for r in ranges] for role, ranges in attributed.items()}
    for number, start, end in steps:
        costs = {c: clipped_length(attributed[c], starts[c], start, end) for c in CATEGORIES}
        result.steps.append(StepBreakdown(number, start, end, costs))
    return result


def _align_steps_to_device(
    steps: list[tuple[int | None, float, float]], runtimes: list[Span], device: list[Span]
) -> tuple[list[tuple[int | None, float, float]], bool, int]:
    """torch-tb-profiler's _find_device_steps/_update_steps_duration: a step ends when the GPU work launched
    (by runtime calls inside its host span) ends, and starts no earlier than the previous step's end."""
    by_correlation: dict[Any, list[int]] = defaultdict(list)
    for index, d in enumerate(device):
        if d.correlation is not None:
            by_correlation[d.correlation].append(index)
    host_starts = [s[1] for s in steps]
    dev_lo = [math.inf] * len(steps)
    dev_hi = [-math.inf] * len(steps)
    matched_counts = [0] * len(steps)
    matched: set[int] = set()
    for rt in runtimes:
        i = bisect.bisect_right(host_starts, rt.start) - 1
        if i < 0 or rt.end > steps[i][2] or rt.correlation is None:
            continue  # launched outside any step, or straddling a step's end
        for index in by_correlation.get(rt.correlation, ()):
            work = device[index]
            if work.start < dev_lo[i]:
                dev_lo[i] = work.start
            if work.end > dev_hi[i]:
                dev_hi[i] = work.end
            matched_counts[i] += 1
            matched.add(index)
    if not matched:
        return steps, False, 0
    prev_end = steps[0][1]
    if dev_lo[0] < math.inf:  # GPU work left over from before the first step delays its start
        for index, d in enumerate(device):
            if index not in matched and d.end < dev_lo[0]:
                prev_end = max(prev_end, d.end)
    aligned = []
    for i, (number, host_start, host_end) in enumerate(steps):
        start = max(prev_end, host_start)
        end = max(host_end, dev_hi[i]) if matched_counts[i] else max(host_end, start)
        end = max(end, start)
        aligned.append((number, start, end))
        prev_end = end
    keep = len(aligned)
    last = max((i for i, count in enumerate(matched_counts) if count), default=-1)
    if len(aligned) > 1 and last >= 0:
        keep = last + 1
        if last > 0 and matched_counts[last - 1] * _TAIL_STEP_KERNEL_RATIO > matched_counts[last]:
            keep = last
    return aligned[:keep], True, len(aligned) - keep
