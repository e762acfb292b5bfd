"""Analyses over the events of torch.profiler Chrome traces (``*.pt.trace.json[.gz]``).

The analysis half of the trace code; :mod:`lightning_perf.traces.reader` reads and rewrites the files
(HolisticTraceAnalysis style: parsing kept apart from the analyses that read parsed data):

- parsed data: :func:`load_trace` streams one file through :class:`~lightning_perf.traces.reader.TraceReader` and
  keeps only the fields the analyses read, as compact :class:`Span` tuples (:func:`span_of`) in a
  :class:`ParsedTrace`;
- interval arithmetic over sorted, disjoint (start, end) lists: :func:`merge_ranges`,
  :func:`intersect_ranges`, :func:`subtract_ranges`, :func:`ranges_length`;
- analyses over events (reader dicts or spans): :func:`step_spans`, :func:`step_breakdown` (the Overview
  breakdown of torch-tb-profiler, in :data:`CATEGORIES`), :func:`kernel_busy_pct` (its "GPU Utilization"),
  :func:`cpu_operator_stats` and :func:`kernel_stats`.

Standard library only; imports nothing from torch or Lightning. Times are in microseconds, as in the trace.
"""

from __future__ import annotations

import bisect
import math
import os
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from lightning_perf.traces.reader import (
    DISTRIBUTED_INFO_KEY,
    USER_ANNOTATION_CAT,
    TraceReader,
    is_dataloader_span,
)

# Category names, lower-cased (torch-tb-profiler lower-cases `cat` before looking it up).
KERNEL_CATS = frozenset({"kernel"})
MEMCPY_CATS = frozenset({"memcpy", "gpu_memcpy"})
MEMSET_CATS = frozenset({"memset", "gpu_memset"})
# "runtime" is the only name torch-tb-profiler 0.4.3 knows; torch 2.x writes cuda_runtime / cuda_driver.
RUNTIME_CATS = frozenset({"runtime", "cuda_runtime", "cuda_driver"})
OPERATOR_CATS = frozenset({"cpu_op", "operator", "python"})
PYTHON_FUNCTION_CAT = "python_function"
# torch-tb-profiler's event_parser.py: these names are collectives whatever their category.
COMMUNICATION_OP_NAMES = frozenset(
    f"{lib}:{op}"
    for lib in ("nccl", "gloo")
    for op in ("broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter")
)
PROFILER_STEP_PREFIX = "ProfilerStep#"
# Two float timestamps closer than this are the same instant: ts ~5e12 us carries ~0.001 us of rounding.
TIME_TOLERANCE_US = 0.01


# ---------------------------------------------------------------------------------------------------------
# Parsed data: the fields the analyses read
# ---------------------------------------------------------------------------------------------------------


class Span(NamedTuple):
    """One complete ('X') event with the fields the analyses read. Times in microseconds."""

    name: str
    cat: str  # lower-cased
    start: float
    end: float
    pid: Any
    tid: Any
    external_id: int | None
    correlation: int | None


def span_of(event: Mapping[str, Any]) -> Span | None:
    """The span of a complete event; None for any other phase. ValueError when its ts/dur are not numbers."""
    if event.get("ph") != "X":
        return None
    ts = event.get("ts")
    dur = event.get("dur", 0)
    if not _is_time(ts) or not _is_time(dur) or dur < 0 or not math.isfinite(ts + dur):
        raise ValueError(
            f"event {event.get('name')!r} has no finite ts or no finite dur >= 0: ts={ts!r}, dur={dur!r}"
        )
    args = event.get("args")
    external_id = correlation = None
    if isinstance(args, dict):
        external_id = args.get("External id", args.get("external id"))
        correlation = args.get("correlation")
    return Span(
        sys.intern(str(event.get("name", ""))),  # a few hundred distinct names over ~1e5 events
        sys.intern(str(event.get("cat", "")).lower()),
        float(ts),
        float(ts) + float(dur),
        event.get("pid"),
        event.get("tid"),
        external_id,
        correlation,
    )


def _is_time(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class ParsedTrace:
    """What :func:`load_trace` keeps of one trace file."""

    path: str
    metadata: dict[str, Any]
    # complete events but python_function ones (no analysis reads them; they are most of a with_stack trace)
    spans: list[Span]
    event_count: int
    # complete events left out because their ts/dur are missing, negative or not finite, and the first reason
    skipped_events: int = 0
    skip_reason: str | None = None

    @property
    def rank(self) -> int | None:
        info = self.metadata.get(DISTRIBUTED_INFO_KEY)
        rank = info.get("rank") if isinstance(info, dict) else None
        return rank if isinstance(rank, int) else None


def load_trace(path: str | os.PathLike[str]) -> ParsedTrace:
    """Stream one trace file into a :class:`ParsedTrace`. :class:`TraceError` naming the file on bad JSON;
    events with impossible times are skipped and counted (``skipped_events``), never turned into inf/nan."""
    spans: list[Span] = []
    count = skipped = 0
    reason = None
    with TraceReader(path) as reader:
        for event in reader.events():
            count += 1
            if event.get("cat") == PYTHON_FUNCTION_CAT:
                continue
            try:
                span = span_of(event)
            except ValueError as err:
                skipped += 1
                reason = reason or f"traceEvents[{count - 1}]: {err}"
                continue
            if span is not None:
                spans.append(span)
        return ParsedTrace(reader.path, reader.metadata, spans, count, skipped, reason)


def _as_spans(events: Iterable[Mapping[str, Any] | Span]) -> Iterator[Span]:
    for event in events:
        if isinstance(event, Span):
            yield event
        else:
            span = span_of(event)
            if span is not None:
                yield span


# ---------------------------------------------------------------------------------------------------------
# Interval arithmetic over sorted, disjoint (start, end) lists
# ---------------------------------------------------------------------------------------------------------

Ranges = list[tuple[float, float]]


def merge_ranges(ranges: Iterable[tuple[float, float]]) -> Ranges:
    """Sorted, disjoint union of intervals (touching ones joined)."""
    merged: Ranges = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def intersect_ranges(a: Ranges, b: Ranges) -> Ranges:
    out: Ranges = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract_ranges(a: Ranges, b: Ranges) -> Ranges:
    out: Ranges = []
    j = 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > start:
                out.append((start, b[k][0]))
            start = max(start, b[k][1])
            k += 1
        if start < end:
            out.append((start, end))
    return out


def ranges_length(ranges: Iterable[tuple[float, float]]) -> float:
    return math.fsum(end - start for start, end in ranges)


def _clipped_length(ranges: Ranges, starts: list[float], start: float, end: float) -> float:
    """Length of sorted disjoint ``ranges`` (whose starts are ``starts``) inside [start, end]."""
    i = max(bisect.bisect_right(starts, start) - 1, 0)
    total = 0.0
    while i < len(ranges) and ranges[i][0] < end:
        total += max(0.0, min(end, ranges[i][1]) - max(start, ranges[i][0]))
        i += 1
    return total


# ---------------------------------------------------------------------------------------------------------
# Analyses
# ---------------------------------------------------------------------------------------------------------


class StepSpan(NamedTuple):
    step: int
    start: float
    end: float


def _is_step(span: Span) -> bool:
    # host-side only: torch also mirrors ProfilerStep# onto GPU streams as gpu_user_annotation
    return span.name.startswith(PROFILER_STEP_PREFIX) and not span.cat.startswith("gpu_")


def _step_number(name: str) -> int | None:
    try:
        return int(name[len(PROFILER_STEP_PREFIX) :])
    except ValueError:
        return None


def step_spans(events: Iterable[Mapping[str, Any] | Span]) -> list[StepSpan]:
    """The host-side ProfilerStep#N spans, sorted by start."""
    steps = []
    for span in _as_spans(events):
        if _is_step(span):
            number = _step_number(span.name)
            if number is not None:
                steps.append(StepSpan(number, span.start, span.end))
    return sorted(steps, key=lambda s: s.start)


def kernel_busy_pct(
    events: Iterable[Mapping[str, Any] | Span], window: tuple[float, float] | None = None
) -> float | None:
    """Share (0-100) of ``window`` in which at least one GPU kernel (cat ``kernel``) ran: torch-tb-profiler's
    "GPU Utilization". Kernel intervals are merged (overlaps count once) and clipped to the window, which
    defaults to the first ProfilerStep# start .. the last ProfilerStep# end (the span of all complete events
    when there is no step). None when there are no kernel events."""
    kernels: Ranges = []
    step_lo = lo = math.inf
    step_hi = hi = -math.inf
    for span in _as_spans(events):
        if span.cat in KERNEL_CATS:
            kernels.append((span.start, span.end))
        elif _is_step(span):
            step_lo, step_hi = min(step_lo, span.start), max(step_hi, span.end)
        lo, hi = min(lo, span.start), max(hi, span.end)
    if not kernels:
        return None
    if window is None:
        window = (step_lo, step_hi) if step_lo < math.inf else (lo, hi)
        if not window[1] > window[0]:
            return None  # the trace spans no time (zero-length events only): no share to give
    start, end = window
    if not end > start:
        raise ValueError(f"window must be (start, end) with end > start, got {window!r}")
    busy = ranges_length(intersect_ranges(merge_ranges(kernels), [(start, end)]))
    return 100.0 * busy / (end - start)


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
    roles: dict[str, Ranges] = {role: [] for role in _PRIORITY}
    kernels: list[Span] = []
    device: list[Span] = []
    runtimes: list[Span] = []
    comm_ids: set[Any] = set()
    steps: list[tuple[int | None, float, float]] = []
    cpu_lo, cpu_hi = math.inf, -math.inf
    for span in _as_spans(events):
        cat, interval = span.cat, (span.start, span.end)
        if cat in KERNEL_CATS:
            kernels.append(span)
            device.append(span)
        elif cat in MEMCPY_CATS:
            roles["memcpy"].append(interval)
            device.append(span)
        elif cat in MEMSET_CATS:
            roles["memset"].append(interval)
            device.append(span)
        elif cat in RUNTIME_CATS:
            roles["runtime"].append(interval)
            runtimes.append(span)
        elif is_dataloader_span(span.name) and not cat.startswith("gpu_"):
            roles["dataloader"].append(interval)
        elif _is_step(span):
            steps.append((_step_number(span.name), span.start, span.end))
        elif span.name in COMMUNICATION_OP_NAMES and (cat in OPERATOR_CATS or cat == USER_ANNOTATION_CAT):
            roles["communication"].append(interval)
            if span.external_id is not None:
                comm_ids.add(span.external_id)
        elif cat in OPERATOR_CATS:
            roles["cpu_exec"].append(interval)
        if cat in OPERATOR_CATS or _is_step(span):
            cpu_lo, cpu_hi = min(cpu_lo, span.start), max(cpu_hi, span.end)
    for k in kernels:
        comm = (k.external_id is not None and k.external_id in comm_ids) or k.name.lower().startswith("nccl")
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
        costs = {c: _clipped_length(attributed[c], starts[c], start, end) for c in CATEGORIES}
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
            dev_lo[i] = min(dev_lo[i], device[index].start)
            dev_hi[i] = max(dev_hi[i], device[index].end)
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


@dataclass
class OperatorStat:
    name: str
    calls: int
    self_us: float
    total_us: float


def cpu_operator_stats(events: Iterable[Mapping[str, Any] | Span]) -> list[OperatorStat]:
    """Host operators (cpu_op and user_annotation spans, ProfilerStep# excluded) aggregated by name, sorted by
    self time: each span's duration minus its direct children's on the same thread (torch's self_cpu_time)."""
    by_thread: dict[tuple[Any, Any], list[Span]] = defaultdict(list)
    for span in _as_spans(events):
        if span.cat in OPERATOR_CATS or span.cat == USER_ANNOTATION_CAT:
            by_thread[(span.pid, span.tid)].append(span)
    stats: dict[str, OperatorStat] = {}

    def record(name: str, self_us: float, total_us: float) -> None:
        if name.startswith(PROFILER_STEP_PREFIX):
            return
        stat = stats.get(name)
        if stat is None:
            stat = stats[name] = OperatorStat(name, 0, 0.0, 0.0)
        stat.calls += 1
        stat.self_us += max(self_us, 0.0)
        stat.total_us += total_us

    for spans in by_thread.values():
        spans.sort(key=lambda s: (s.start, -s.end))
        stack: list[list[Any]] = []  # [end, self time, span]
        for span in spans:
            while stack and stack[-1][0] <= span.start + TIME_TOLERANCE_US:
                _, self_us, done = stack.pop()
                record(done.name, self_us, done.end - done.start)
            duration = span.end - span.start
            if stack and span.end <= stack[-1][0] + TIME_TOLERANCE_US:
                stack[-1][1] -= duration  # a direct child
            stack.append([span.end, duration, span])
        for _, self_us, done in stack:
            record(done.name, self_us, done.end - done.start)
    return sorted(stats.values(), key=lambda s: s.self_us, reverse=True)


def kernel_stats(events: Iterable[Mapping[str, Any] | Span]) -> list[OperatorStat]:
    """GPU kernels aggregated by name, sorted by total time (a kernel's self time is its duration)."""
    stats: dict[str, OperatorStat] = {}
    for span in _as_spans(events):
        if span.cat in KERNEL_CATS:
            stat = stats.get(span.name)
            if stat is None:
                stat = stats[span.name] = OperatorStat(span.name, 0, 0.0, 0.0)
            stat.calls += 1
            stat.self_us += span.end - span.start
            stat.total_us += span.end - span.start
    return sorted(stats.values(), key=lambda s: s.total_us, reverse=True)
