"""torch-tb-profiler's Overview step breakdown: each ProfilerStep's time split into categories.

See :func:`step_breakdown`. Standard library and numpy. Times are in microseconds, as in the trace.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lightning_perf.errors import ConfigError
from lightning_perf.traces.figures.intervals import (
    Intervals,
    clipped_lengths,
    intersect,
    merge,
    ordered_sum,
    subtract,
    union_of,
    window,
)
from lightning_perf.traces.read.columns import SpanColumns, columns_of
from lightning_perf.traces.read.reader import USER_ANNOTATION_CAT, is_dataloader_span
from lightning_perf.traces.read.spans import (
    COMMUNICATION_OP_NAMES,
    KERNEL_CATS,
    MEMCPY_CATS,
    MEMSET_CATS,
    OPERATOR_CATS,
    PROFILER_STEP_PREFIX,
    RUNTIME_CATS,
    Span,
    step_number,
)
from lightning_perf.traces.vendors import is_communication_kernel_name

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
# How steps are aligned to the GPU work they launched (see step_breakdown).
TB_ALIGNMENT, LAUNCH_ALIGNMENT = "torch-tb-profiler", "launch"
ALIGNMENTS = (TB_ALIGNMENT, LAUNCH_ALIGNMENT)
Steps = list[tuple[int | None, float, float]]  # (number, start, end) of each step


# What a span is to the breakdown, times two: the odd codes are spans that also mark the host's extent
# (operators and steps), for a trace without ProfilerStep#.
_KERNEL, _MEMCPY, _MEMSET, _RUNTIME, _DATALOADER, _STEP, _COMM_OP, _CPU_EXEC, _NOTHING = range(0, 18, 2)
_KIND_COUNT = 18


def _kind_of(cat: str, name: str) -> int:
    step = name.startswith(PROFILER_STEP_PREFIX) and not cat.startswith("gpu_")  # is_step()
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
    elif step:
        kind = _STEP
    elif name in COMMUNICATION_OP_NAMES and (cat in OPERATOR_CATS or cat == USER_ANNOTATION_CAT):
        kind = _COMM_OP
    elif cat in OPERATOR_CATS:
        kind = _CPU_EXEC
    else:
        kind = _NOTHING
    return kind + (cat in OPERATOR_CATS or step)


@dataclass
class StepBreakdown:
    """One step's time per category (microseconds); the categories sum to the step's duration."""

    # None: no ProfilerStep# in the trace, the steps unknown: the whole host span as one step (as the plugin), or
    # the whole trace in one without CPU events (a GPU-only trace)
    step: int | None
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
    # "launch" alignment with GPU work: a step may overlap the next one (its GPU work still running when the
    # next starts), so the mean step is longer than the profiled time over the steps
    overlapping: bool = False
    # the DataLoader calls' time in the host steps (us a step) whatever ran beside them: ranks are compared on it,
    # as the alignment hides a call made under the previous step's trailing kernels (the share is exposed time)
    dataloader_host_us: float | None = None

    def average(self) -> dict[str, float]:
        """Mean per category over the steps, plus ``total`` (the mean step duration). Empty without steps."""
        if not self.steps:
            return {}
        n = len(self.steps)
        avg = {c: math.fsum(s.categories[c] for s in self.steps) / n for c in CATEGORIES}
        avg["total"] = math.fsum(s.duration for s in self.steps) / n
        return avg


def step_breakdown(events: Iterable[Mapping[str, Any] | Span], alignment: str = TB_ALIGNMENT) -> Breakdown:
    """Each ProfilerStep's time split into torch-tb-profiler's Overview categories (event_parser.py and
    overall_parser.py of torch-tb-profiler 0.4.3), with these deliberate differences for torch 2.x traces:

    - DataLoader spans count whatever their category (the plugin drops user_annotation ones: DataLoader = 0
      unless the trace went through :func:`rewrite_trace`); GPU-side mirrors (gpu_*) are ignored;
    - cuda_runtime / cuda_driver count as Runtime (the plugin only knows the old name "Runtime");
    - kernels named for a collective library (nccl, rccl, msccl: traces/vendors.py) count as Communication even
      without a matching nccl:* op;
    - ProfilerStep# mirrors on GPU streams (gpu_user_annotation) are not steps.

    Other user_annotation spans (record_function ranges) are not CPU Exec, as in the plugin: only the
    operators inside them are. A trace without CPU events (GPU-only) is one step of unknown number (None)
    over the whole trace, as the plugin takes the host span of a trace without ProfilerStep#.

    ``alignment``: "torch-tb-profiler" (the plugin's: the steps partition the time; a step starts no earlier
    than the previous step's GPU work ends, so a DataLoader call made while that work still runs is counted as
    the Kernel time it overlaps, in the previous step) or "launch" (:func:`_own_costs`: a step runs from its
    host start to the end of the GPU work it launched, and its categories count its own spans only).
    """
    if alignment not in ALIGNMENTS:
        raise ConfigError(f"alignment must be one of {ALIGNMENTS}, got {alignment!r}")
    # what each span is depends on (category, name) only: a few hundred pairs, each decided once
    cols = columns_of(events)
    kind = cols.classify(_kind_of)
    what = kind & ~1  # without the host-extent flag

    def group(code: int) -> list[Span]:
        return cols.picked(kind == code) + cols.picked(kind == code + 1)  # without and with the flag

    kernels = what == _KERNEL
    comm_ops = what == _COMM_OP
    comm_ids = {e for e in cols.external_id[comm_ops].tolist() if e is not None}
    # kernels of a collective: linked to a nccl:* / gloo:* operator, or named for a collective library
    comm_kernels = kernels & cols.where_name(is_communication_kernel_name)
    if comm_ids:
        linked = np.flatnonzero(kernels)
        # a bool array even when no kernel is linked (a CPU-only gloo trace): |= of an empty list is float64
        comm_kernels[linked] |= np.fromiter(
            (e in comm_ids for e in cols.external_id[linked].tolist()), dtype=bool, count=linked.size
        )
    masks = {
        "kernel": kernels & ~comm_kernels,
        "memcpy": what == _MEMCPY,
        "memset": what == _MEMSET,
        "runtime": what == _RUNTIME,
        "dataloader": what == _DATALOADER,
        "communication": comm_ops | comm_kernels,
        "cpu_exec": what == _CPU_EXEC,
    }
    steps: Steps = [(step_number(s.name), s.start, s.end) for s in group(_STEP)]
    steps.sort(key=lambda s: s[1])
    host = (kind & 1) == 1  # operators and steps
    device = kernels | (what == _MEMCPY) | (what == _MEMSET)
    if not steps and host.any():
        cpu_lo, cpu_hi = float(cols.start[host].min()), float(cols.end[host].max())
        if cpu_lo < cpu_hi:
            steps = [(None, cpu_lo, cpu_hi)]
    elif not steps and device.any():  # no CPU operator (a GPU-only trace): the whole trace as one step
        lo, hi = float(cols.start.min()), float(cols.end.max())
        if lo < hi:
            steps = [(None, lo, hi)]
    result = Breakdown()
    if not steps:
        return result
    launch = alignment == LAUNCH_ALIGNMENT
    host_steps = steps
    result.dataloader_host_us = _host_time_per_step(cols, masks["dataloader"], host_steps)
    steps, result.device_aligned, result.dropped_tail_steps, pairs = _align_steps_to_device(
        steps, cols, what == _RUNTIME, device, keep_starts=launch
    )
    if launch and result.device_aligned:
        result.overlapping = True
        per_step = _own_costs(cols, masks, device, pairs, host_steps, steps)
        costs = {c: [step[c] for step in per_step] for c in CATEGORIES}
    else:
        costs = _partition_costs(cols, masks, steps)
    for i, (number, start, end) in enumerate(steps):
        result.steps.append(StepBreakdown(number, start, end, {c: costs[c][i] for c in CATEGORIES}))
    return result


def _host_time_per_step(cols: SpanColumns, mask: np.ndarray, steps: Steps) -> float:
    """The time the spans of ``mask`` cover inside the host steps (their union: nested calls once), a step."""
    starts = np.array([start for _, start, _ in steps], dtype=np.float64)
    ends = np.array([end for _, _, end in steps], dtype=np.float64)
    covered = intersect(merge(starts, ends), union_of(cols, mask))
    return math.fsum(clipped_lengths(covered, starts, ends)) / len(steps)


def _partition_costs(cols: SpanColumns, masks: dict[str, np.ndarray], steps: Steps) -> dict[str, list[float]]:
    """The plugin's attribution: each moment of a step goes to the first role active then (in the order of
    _PRIORITY), whatever step's span made it active; "other" when none."""
    starts = np.array([start for _, start, _ in steps], dtype=np.float64)
    ends = np.array([end for _, _, end in steps], dtype=np.float64)
    slots = merge(starts, ends)
    attributed: dict[str, Intervals] = {}
    for role in _PRIORITY:
        attributed[role] = intersect(slots, union_of(cols, masks[role]))
        slots = subtract(slots, attributed[role])
    attributed["other"] = slots
    return {c: clipped_lengths(attributed[c], starts, ends) for c in CATEGORIES}


def _own_costs(
    cols: SpanColumns,
    masks: dict[str, np.ndarray],
    device: np.ndarray,
    pairs: tuple[np.ndarray, np.ndarray],
    host_steps: Steps,
    steps: Steps,
) -> list[dict[str, float]]:
    """The "launch" attribution: each moment of a step goes to the first role (in the order of _PRIORITY) made
    active by the step's own spans: the GPU work it launched (``pairs``: each linked activity and its step),
    the GPU work no call launched that started after its host start (before the next step's), and the CPU
    spans that start inside its host span. So the GPU work of the previous step still running when a step
    starts counts in the previous step only, and the DataLoader call it overlaps stays in its own step."""
    linked, step_of_work = pairs
    host_starts = np.array([start for _, start, _ in host_steps], dtype=np.float64)
    host_ends = np.array([end for _, _, end in host_steps], dtype=np.float64)
    label = np.full(len(cols), -1, dtype=np.int64)
    cpu = np.flatnonzero(~device)
    label[cpu] = _step_of(cols.start[cpu], host_starts, host_ends)
    unlinked = device.copy()
    unlinked[linked] = False
    unlinked &= ~before_steps(cols, unlinked, host_starts[0])
    label[unlinked] = np.searchsorted(host_starts, cols.start[unlinked], side="right") - 1
    n = len(steps)
    grouped: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for role in _PRIORITY:
        own = np.flatnonzero(masks[role] & (label >= 0) & (label < n))
        of_role = masks[role][linked] & (step_of_work < n)
        index = np.concatenate((own, linked[of_role]))
        step = np.concatenate((label[own], step_of_work[of_role]))
        order = np.argsort(step, kind="stable")
        grouped[role] = (index[order], np.searchsorted(step[order], np.arange(n + 1)))
    costs = []
    for k, (_, start, end) in enumerate(steps):
        slot, categories = window(start, end), {}
        for role in _PRIORITY:
            index, bounds = grouped[role]
            chosen = index[bounds[k] : bounds[k + 1]]
            got = intersect(slot, merge(cols.start[chosen], cols.end[chosen]))
            categories[role] = ordered_sum(got.hi - got.lo)
            slot = subtract(slot, got)
        categories["other"] = ordered_sum(slot.hi - slot.lo)
        costs.append(categories)
    return costs


def _step_of(times: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For each time, the index of the step (sorted by start) whose span holds it; -1 outside every step."""
    index = np.searchsorted(starts, times, side="right") - 1
    inside = index >= 0
    inside[inside] = times[inside] <= ends[index[inside]]
    return np.where(inside, index, -1)


def before_steps(cols: SpanColumns, mask: np.ndarray, first: float) -> np.ndarray:
    """Mask of the spans of ``mask`` whose correlation id is below that of every runtime call made from
    ``first`` on: GPU work launched before the profiled steps, whose call the trace does not hold (the ids count
    the runtime calls of a process, CUPTI's and roctracer's alike). All False where ids are not all ints."""
    ids = cols.correlation_ids
    calls = cols.in_cats(RUNTIME_CATS) & cols.has_correlation & (cols.start >= first)
    if ids is None or not calls.any():
        return np.zeros(len(cols), dtype=bool)
    return mask & cols.has_correlation & (ids < ids[calls].min())


def launch_times(cols: SpanColumns, calls: np.ndarray, work: np.ndarray) -> np.ndarray:
    """For each span of ``work`` (indices), the start of the runtime call of ``calls`` (a mask of spans with a
    correlation id) that has its correlation id (of several, the last in file order); NaN where none has it."""
    times = np.full(len(work), np.nan)
    has = np.flatnonzero(cols.has_correlation[work])
    call_index = np.flatnonzero(calls)
    ids = cols.correlation_ids
    if ids is None:  # ids of other types: matched through a dict
        start_of = dict(
            zip(cols.correlation[call_index].tolist(), cols.start[call_index].tolist(), strict=True)
        )
        found = (start_of.get(c, math.nan) for c in cols.correlation[work[has]].tolist())
        times[has] = np.fromiter(found, dtype=np.float64, count=len(has))
        return times
    call_ids = ids[call_index]
    order = np.argsort(call_ids, kind="stable")
    sorted_ids = call_ids[order]
    last = np.ones(len(sorted_ids), dtype=bool)  # the last of each run of equal ids: the last in file order
    last[:-1] = sorted_ids[1:] != sorted_ids[:-1]
    unique_ids, starts = sorted_ids[last], cols.start[call_index[order[last]]]
    if not len(unique_ids):
        return times
    work_ids = ids[work[has]]
    place = np.minimum(np.searchsorted(unique_ids, work_ids), len(unique_ids) - 1)
    found = unique_ids[place] == work_ids
    times[has[found]] = starts[place[found]]
    return times


def _pairs_by_sort(
    call_ids: np.ndarray, call_steps: np.ndarray, work: np.ndarray, work_ids: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each (GPU activity of ``work``, step of a call with its id) pair, as two arrays: a join of int64 ids by
    sorting the calls' (a repeated id links the activity to each of its calls' steps)."""
    order = np.argsort(call_ids, kind="stable")
    call_ids, call_steps = call_ids[order], call_steps[order]
    first = np.searchsorted(call_ids, work_ids, side="left")
    counts = np.searchsorted(call_ids, work_ids, side="right") - first
    linked = np.repeat(work, counts)
    # for each pair, its place among its activity's calls: 0, 1, ... counts - 1
    place = np.arange(len(linked)) - np.repeat(np.cumsum(counts) - counts, counts)
    return linked, call_steps[np.repeat(first, counts) + place]


def _pairs_by_dict(
    call_ids: list[Any], call_steps: np.ndarray, work: np.ndarray, work_ids: list[Any]
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_pairs_by_sort` for ids of any (hashable) type."""
    steps_of: dict[Any, list[int]] = defaultdict(list)
    for correlation, step in zip(call_ids, call_steps.tolist(), strict=True):
        steps_of[correlation].append(step)
    pairs = [
        (index, step)
        for index, correlation in zip(work.tolist(), work_ids, strict=True)
        for step in steps_of.get(correlation, ())
    ]
    if not pairs:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    linked, step_of_work = (np.array(column, dtype=np.int64) for column in zip(*pairs, strict=True))
    return linked, step_of_work


def _align_steps_to_device(
    steps: Steps, cols: SpanColumns, runtimes: np.ndarray, device: np.ndarray, keep_starts: bool = False
) -> tuple[Steps, bool, int, tuple[np.ndarray, np.ndarray]]:
    """torch-tb-profiler's _find_device_steps/_update_steps_duration: a step ends when the GPU work launched
    (by runtime calls inside its host span) ends, and starts no earlier than the previous step's end (with
    ``keep_starts``: at its host start, the previous step's GPU work may still run). ``runtimes`` and
    ``device``: masks of the runtime calls and the GPU activities among ``cols``. Also returns each linked
    (GPU activity, step) pair."""
    host_starts = np.array([s[1] for s in steps], dtype=np.float64)
    host_ends = np.array([s[2] for s in steps], dtype=np.float64)
    # the runtime calls wholly inside a step (by start, then end), with a correlation id: the step of each id
    calls = runtimes & cols.has_correlation
    step_of_call = np.searchsorted(host_starts, cols.start[calls], side="right") - 1
    inside = step_of_call >= 0
    inside[inside] = cols.end[calls][inside] <= host_ends[step_of_call[inside]]
    # every (GPU activity, step) pair linked by a correlation id
    work = np.flatnonzero(device & cols.has_correlation)
    ids = cols.correlation_ids
    if ids is None:  # ids of other types (the dict reader keeps any JSON value): matched through a dict
        linked, step_of_work = _pairs_by_dict(
            cols.correlation[calls][inside].tolist(),
            step_of_call[inside],
            work,
            cols.correlation[work].tolist(),
        )
    else:
        linked, step_of_work = _pairs_by_sort(ids[calls][inside], step_of_call[inside], work, ids[work])
    if not len(linked):
        return steps, False, 0, (linked, step_of_work)
    dev_lo = np.full(len(steps), math.inf)
    dev_hi = np.full(len(steps), -math.inf)
    np.minimum.at(dev_lo, step_of_work, cols.start[linked])
    np.maximum.at(dev_hi, step_of_work, cols.end[linked])
    matched_counts = np.bincount(step_of_work, minlength=len(steps)).tolist()
    dev_lo, dev_hi = dev_lo.tolist(), dev_hi.tolist()
    prev_end = steps[0][1]
    if dev_lo[0] < math.inf and not keep_starts:  # GPU work left over from before the first step delays it
        unmatched = device.copy()
        unmatched[linked] = False
        before = cols.end[unmatched & (cols.end < dev_lo[0])]
        if len(before):
            prev_end = max(prev_end, float(before.max()))
    aligned = []
    for i, (number, host_start, host_end) in enumerate(steps):
        start = host_start if keep_starts else max(prev_end, host_start)
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
    return aligned[:keep], True, len(aligned) - keep, (linked, step_of_work)
