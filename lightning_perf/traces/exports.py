"""Exports written beside each trace: flame-graph collapsed stacks, Speedscope JSON and the memory timeline.

The profiler lifecycle (``profiling.py``) calls these at trace-ready time with the live profiler, except
:func:`trace_to_speedscope`, which converts a trace file with the streaming reader of ``traces.py``. A failed
export never breaks training: it logs one warning and reports that nothing was written.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections import defaultdict
from typing import Any

from lightning_perf import console
from lightning_perf.atomic_file import atomic_open, atomic_path, describe_os_error
from lightning_perf.errors import ConfigError
from lightning_perf.traces.figures.analysis import span_of
from lightning_perf.traces.read.reader import TraceReader

log = console.logger(__name__)

SPEEDSCOPE_SCHEMA = "https://www.speedscope.app/file-format-schema.json"
MEMORY_TIMELINE_FLAGS = (
    "profile_memory",
    "record_shapes",
    "with_stack",
)  # torch's _memory_profile() needs all
# ';' separates frames and a line break ends a sample in the collapsed format; other control characters
# would garble the flame graph. All become '_' (torch's own export_stacks does the same for ' ;\t\n').
_FRAME_TRANSLATION = str.maketrans({c: "_" for c in [";", "\x7f", *map(chr, range(32))]})
# Python frames name bound methods with the object's address ("<built-in method sum of Tensor object at
# 0x7f...>"): one frame per tensor would never merge in a flame graph, so the address is dropped.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
# Speedscope times are rounded to the nanosecond, the resolution of torch's timestamps.
_TIME_DECIMALS = 3
_WRITE_BATCH = 4096


def stacks_experimental_config() -> Any:
    """The ``experimental_config`` a profiler needs for :func:`export_collapsed_stacks` (and torch's
    ``export_stacks``) to get Python stacks: without it they are empty (PyTorch issue 100253)."""
    import torch

    return torch._C._profiler._ExperimentalConfig(verbose=True)


def _frame(name: str) -> str:
    return _ADDRESS.sub("", str(name)).translate(_FRAME_TRANSLATION) or "?"


def export_collapsed_stacks(prof: Any, base_path: str) -> list[str]:
    """Write Brendan Gregg collapsed stacks (``frame;frame;... N``, root first, the operator as the leaf, N in
    whole microseconds) of self CPU time to ``<base_path>.cpu.stacks.txt`` and, when device time was recorded,
    of self device time to ``<base_path>.<device>.stacks.txt`` (e.g. ``.cuda.``). Feed them to flamegraph.pl
    or speedscope. Returns the paths written: [] when the profiler ran without ``with_stack``, or recorded no
    stacks (it needs ``experimental_config=stacks_experimental_config()``). OSError when a write fails (no
    partial file is left)."""
    if not getattr(prof, "with_stack", False):
        return []
    try:
        events = list(prof.events())
    except Exception as err:  # a profiler that never ran, or torch internals changing: never break training
        log.warning("lightning-perf: no collapsed stacks, the profiler has no events: %s", err)
        return []
    if not any(getattr(evt, "stack", None) for evt in events):
        log.warning(
            "lightning-perf: the profiler recorded no Python stacks, so no flame graph was written: create it "
            "with experimental_config=lightning_perf.traces.exports.stacks_experimental_config() (PyTorch issue 100253)"
        )
        return []
    cpu: dict[str, float] = defaultdict(float)
    device: dict[str, float] = defaultdict(float)
    for evt in events:
        # device-side events (kernels) carry no stack; their time is already the self device time of the
        # CPU operator that launched them
        if getattr(evt, "is_async", False) or getattr(evt.device_type, "name", "CPU") != "CPU":
            continue
        frames = [_frame(entry) for entry in reversed(evt.stack or [])]
        frames.append(_frame(evt.name))
        key = ";".join(frames)
        cpu[key] += evt.self_cpu_time_total
        device_us = evt.self_device_time_total
        if device_us > 0:
            device[key] += device_us
    device_name = getattr(prof, "use_device", None) or "cuda"
    written = []
    for suffix, totals in (("cpu", cpu), (device_name, device)):
        lines = [f"{stack} {round(us)}" for stack, us in sorted(totals.items()) if round(us) >= 1]
        if not lines:
            continue
        path = f"{base_path}.{suffix}.stacks.txt"
        with atomic_open(path) as fh:
            fh.write("\n".join(lines) + "\n")
        written.append(path)
    return written


def trace_to_speedscope(trace_path: str | os.PathLike[str], out_path: str | os.PathLike[str]) -> None:
    """Convert a Chrome trace to a Speedscope file (https://www.speedscope.app/file-format-schema.json): one
    ``evented`` profile per (pid, tid) thread or GPU stream, in microseconds from the trace's first event.

    Speedscope needs properly nested open/close events. Complete events that overlap without nesting (rare:
    clock skew, async ranges on one thread) are clipped to their parent: an event ends no later than the
    enclosing one, so it keeps its start and name and loses only the overhanging tail. Events with impossible
    times (missing, negative or not finite) are left out with one warning. Streams the trace;
    :class:`~lightning_perf.traces.read.reader.TraceError` naming the file on bad input.
    """
    trace_path, out_path = os.fspath(trace_path), os.fspath(out_path)
    frames: dict[str, int] = {}
    threads: dict[tuple[Any, Any], list[tuple[float, float, int]]] = defaultdict(list)
    process_names: dict[Any, str] = {}
    thread_names: dict[tuple[Any, Any], str] = {}
    skipped, reason = 0, None
    with TraceReader(trace_path) as reader:
        for index, event in enumerate(reader.events()):
            if event.get("ph") == "M":
                label = (event.get("args") or {}).get("name")
                if event.get("name") == "process_name" and label:
                    process_names[event.get("pid")] = str(label)
                elif event.get("name") == "thread_name" and label:
                    thread_names[(event.get("pid"), event.get("tid"))] = str(label)
                continue
            try:
                span = span_of(event)
            except ValueError as err:  # a corrupt time: the event is left out, the rest converted
                skipped += 1
                reason = reason or f"traceEvents[{index}]: {err}"
                continue
            if span is None:
                continue
            frame = frames.setdefault(_ADDRESS.sub("", span.name), len(frames))
            threads[(span.pid, span.tid)].append((span.start, span.end, frame))
    origin = min((s for spans in threads.values() for s, _, _ in spans), default=0.0)

    if skipped:
        log.warning(
            "lightning-perf: %s: %d event(s) with impossible times left out (first: %s)",
            trace_path,
            skipped,
            reason,
        )
    with atomic_open(out_path) as out:
        out.write(f'{{"$schema": {json.dumps(SPEEDSCOPE_SCHEMA)},\n"shared": {{"frames": ')
        out.write(json.dumps([{"name": name} for name in frames], ensure_ascii=False))
        out.write('},\n"profiles": [')
        for number, ((pid, tid), spans) in enumerate(threads.items()):
            name = thread_names.get((pid, tid)) or f"tid {tid}"
            name = f"{process_names.get(pid, 'pid')} {pid} / {name}"
            out.write(",\n" if number else "\n")
            _write_evented_profile(out, name, spans, origin)
        out.write("\n],\n")
        out.write(f'"name": {json.dumps(os.path.basename(trace_path))}, "activeProfileIndex": 0, ')
        out.write('"exporter": "lightning-perf"}\n')


def _write_evented_profile(out: Any, name: str, spans: list[tuple[float, float, int]], origin: float) -> None:
    # relative, rounded times first, so that the nesting below compares exactly the numbers written
    timed = sorted(
        ((round(s - origin, _TIME_DECIMALS), round(e - origin, _TIME_DECIMALS), f) for s, e, f in spans),
        key=lambda x: (x[0], -x[1]),
    )
    parts: list[str] = []
    stack: list[tuple[float, int]] = []  # (end, frame) of the open events; ends never increase upwards
    last = timed[0][0] if timed else 0.0

    def close_until(time: float) -> None:
        nonlocal last
        while stack and stack[-1][0] <= time:
            last, frame = stack.pop()
            parts.append(f'{{"type":"C","frame":{frame},"at":{last!r}}}')

    for start, end, frame in timed:
        close_until(start)
        end = max(end, start)  # a negative duration (a corrupt event) would make time go back
        if stack and end > stack[-1][0]:
            end = stack[-1][0]  # overlaps its parent without nesting: clipped to the parent's end
        parts.append(f'{{"type":"O","frame":{frame},"at":{start!r}}}')
        stack.append((end, frame))
    close_until(float("inf"))
    header = {
        "type": "evented",
        "name": name,
        "unit": "microseconds",
        "startValue": timed[0][0] if timed else 0.0,
        "endValue": last,
    }
    out.write(json.dumps(header, ensure_ascii=False)[:-1] + ', "events": [')
    for i in range(0, len(parts), _WRITE_BATCH):
        out.write(("," if i else "") + ",".join(parts[i : i + _WRITE_BATCH]))
    out.write("]}")


def export_memory_timeline(prof: Any, out_path: str | os.PathLike[str], device: str) -> bool:
    """Write torch's HTML memory timeline of ``device`` (e.g. "cuda:0", "cpu") to ``out_path`` (.html).

    Only for a profiler created with profile_memory, record_shapes and with_stack all True (torch needs the
    three). Returns True when the file was written; False otherwise, with a warning and no file left behind.
    Never raises for a profiler lacking the data; ValueError only for a bad ``out_path`` or ``device``.
    """
    out_path = os.fspath(out_path)
    if not out_path.endswith(".html"):
        raise ConfigError(f"out_path must end with .html (an HTML memory timeline), got {out_path!r}")
    if not isinstance(device, str) or not device:
        raise ConfigError(f"device must be a device name such as 'cuda:0' or 'cpu', got {device!r}")
    missing = [flag for flag in MEMORY_TIMELINE_FLAGS if not getattr(prof, flag, False)]
    if missing:
        log.warning(
            "lightning-perf: no memory timeline: the profiler needs %s",
            ", ".join(f"{flag}=True" for flag in missing),
        )
        return False
    try:
        # torch picks the format from the name's ending, so the temporary name keeps ".html" at its end
        with atomic_path(out_path, ending=".html") as tmp, warnings.catch_warnings():
            # torch deprecates export_memory_timeline in favour of CUDA memory snapshots, which need CUDA
            warnings.simplefilter("ignore", FutureWarning)
            prof.export_memory_timeline(tmp, device)
    except Exception as err:  # torch internals, matplotlib, I/O: a profiling export must never break training
        log.warning(
            "lightning-perf: could not write the memory timeline %s: %s", out_path, describe_os_error(err)
        )
        return False
    return os.path.exists(out_path)
