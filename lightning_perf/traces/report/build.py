"""``lightning-perf report PATH``: what a run's profiler traces and diagnosis say, in one page.

PATH is a run dir, any folder or one trace file. Every Chrome/Kineto trace directly in the folder counts,
recognised by its content whatever its name (``*.pt.trace.json[.gz]``, HTA's ``rank-N.json.gz``, ``test.json.gz``);
other JSON (``perf_summary.json``, hparams) is skipped silently. For every trace (one profiled cycle each): the
figures of :func:`lightning_perf.traces.figures.gpu_figures.trace_figures` (GPU timeline, blocking calls, copies, tensor
cores, memory) and their findings (:mod:`lightning_perf.analysis.rules.trace`); several ranks get a cross-rank
table. Also the time of each ProfilerStep split
into torch-tb-profiler's Overview categories (DataLoader, CPU Exec, Kernel, Memcpy, Memset, Communication,
Runtime, Other; see :func:`lightning_perf.traces.figures.analysis.step_breakdown`) and their averages, the top
operators by self time (CPU, and GPU kernels when recorded) and the GPU kernel-busy share. Then the findings
of ``perf_summary.json`` when there is one. ``--format json`` is machine-readable with stable keys.

Unreadable files (a cut trace, a corrupt summary, a trace whose analysis fails with any error, a
``*.pt.trace.json[.gz]`` that is a dangling symlink, a symlink loop or a FIFO) are listed with their error (and
their rank, from the file's head or name, when it tells) under ``unreadable`` and the readable ones reported,
whatever ``--jobs``; another ``*.json[.gz]`` that cannot be looked at gets a note. A folder holding the traces
of several runs gets a cross-rank view a run (:mod:`lightning_perf.traces.report.runs`). A trace without a
backward pass or optimizer step (:func:`is_training`) is worded as the run (forward-only: serving,
evaluation), not training. Exit codes: 0 ok; 1 some files unreadable;
2 for a missing RUN_DIR, a RUN_DIR with neither traces nor summary, or nothing readable in it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import math
import os
import re
import stat
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from lightning_perf.analysis.matrix_cores import with_run_settings
from lightning_perf.analysis.rules.trace import diagnose_trace
from lightning_perf.analysis.summary import SUMMARY_FILENAME, RunSummary, Settings, SummaryError
from lightning_perf.analysis.trace_figures import TraceFigures
from lightning_perf.atomic_file import describe_os_error
from lightning_perf.errors import LightningPerfError
from lightning_perf.traces.figures.analysis import (
    CATEGORIES,
    OperatorStat,
    cpu_operator_stats,
    kernel_busy_pct,
    kernel_stats,
    load_trace,
    step_breakdown,
)
from lightning_perf.traces.figures.breakdown import ALIGNMENTS, TB_ALIGNMENT
from lightning_perf.traces.figures.gpu_figures import trace_figures
from lightning_perf.traces.figures.modules import module_times
from lightning_perf.traces.read.columns import SpanColumns
from lightning_perf.traces.read.gunzip import GZIP_ERRORS, open_gzip_text
from lightning_perf.traces.read.parallel_reader import capped_jobs, check_jobs, map_traces
from lightning_perf.traces.read.reader import GZIP_MAGIC, TraceError
from lightning_perf.traces.read.spans import gc_paused
from lightning_perf.traces.report.changes import cycle_changes
from lightning_perf.traces.report.findings import finding_dict, summary_findings
from lightning_perf.traces.report.ranks import SPREAD_FIGURES, rank_spread  # noqa: F401 (the report's names)
from lightning_perf.traces.report.runs import group_runs, mixed_runs_note, run_entry

TRACE_SUFFIXES = (".json", ".json.gz")
TORCH_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")
# How far into a file to look for the traceEvents key: torch writes it after deviceProperties (~0.5 KiB a GPU),
# HTA's and Chrome's traces first. 1 MiB is far beyond either and costs a few ms.
SNIFF_CHARS = 1 << 20
_SNIFF_CHUNK = 1 << 16
DEFAULT_TOP = 10
REPORT_SCHEMA = "lightning-perf/report"
REPORT_SCHEMA_VERSION = 2
_US_PER_MS = 1000.0
# Operator and kernel names only a training step has, lower case: torch's autograd engine and backward
# operators (``autograd::engine::evaluate_function: MmBackward0``, ``aten::convolution_backward``, the
# profiler's ``## backward ##``), its optimizer annotations (``Optimizer.step#SGD.step``,
# ``Optimizer.zero_grad#SGD.zero_grad``) and Lightning's hooks (``[LightningModule]M.optimizer_step``).
TRAINING_MARKS = ("backward", "autograd::engine", "optimizer.step", "optimizer.zero_grad", "optimizer_step")
# A rank in an unreadable file: torch's distributedInfo near its start, else the file name (``rank-5``,
# ``host_rank5.<ns>``, ``rank5``).
_INFO_RANK = re.compile(r'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(\d+)')
_NAME_RANK = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


class ReportError(LightningPerfError):
    """The report cannot be made; the message says why and names the path."""


def is_trace_file(path: str) -> bool:
    """Whether ``path`` is a Chrome/Kineto trace: named ``*.pt.trace.json[.gz]`` (torch's own name: a broken one
    is reported, not skipped), or a JSON object with a ``traceEvents`` key near its start, plain or gzip.
    Unreadable files and other JSON are not traces (no error)."""
    if path.endswith(TORCH_SUFFIXES):
        return True
    head = _head(path)
    return head.lstrip().startswith("{") and '"traceEvents"' in head


def _head(path: str) -> str:
    """The file's text up to its traceEvents key (at most SNIFF_CHARS), plain or gzip; what it could read."""
    head = ""
    try:
        with open(path, "rb") as fh:
            gz = fh.read(2) == GZIP_MAGIC
        with (
            open_gzip_text(path, errors="replace")
            if gz
            else open(path, encoding="utf-8", errors="replace") as fh
        ):
            # stop at the key: a folder of a thousand ranks is sniffed before the pool starts
            while (
                len(head) < SNIFF_CHARS and '"traceEvents"' not in head and (chunk := fh.read(_SNIFF_CHUNK))
            ):
                head += chunk
    except GZIP_ERRORS + (OSError,):
        pass  # a truncated file still shows its start
    return head


def unreadable_rank(path: str) -> int | None:
    """The rank of a trace that could not be read: its ``distributedInfo`` when near its start, else a rank in
    its name; None when neither tells."""
    found = _INFO_RANK.search(_head(path)) or _NAME_RANK.search(os.path.basename(path))
    return int(found.group(1)) if found else None


def find_traces(run_dir: str) -> list[str]:
    """The trace files directly in ``run_dir``, by content, sorted by name (worker, then cycle timestamp)."""
    return scan_folder(run_dir)[0]


def scan_folder(run_dir: str, skip: Callable[[str], str | None] = lambda _: None) -> tuple[list, list, list]:
    """What :func:`find_traces` finds, and what it passes over that is not a plain file: (traces, unreadable
    entries named like torch's traces with why, one note for each other ``*.json[.gz]`` that cannot be looked
    at). A dangling symlink, a symlink loop, a FIFO (never opened: reading one blocks) or a directory is not
    read; one named ``*.pt.trace.json[.gz]`` is a broken trace. One ``skip`` has a reason for is not listed."""
    traces, unreadable, notes = [], [], []
    for name in sorted(os.listdir(run_dir)):
        path = os.path.join(run_dir, name)
        if not name.endswith(TRACE_SUFFIXES) or skip(path) is not None:  # the Perf tab's: a symlink out
            continue
        why = _not_a_plain_file(path)
        if why is None:
            if is_trace_file(path):
                traces.append(path)
        elif name.endswith(TORCH_SUFFIXES):
            found = _NAME_RANK.search(name)
            rank = int(found.group(1)) if found else None
            unreadable.append({"file": name, "rank": rank, "error": f"{path}: {why}"})
        elif name != SUMMARY_FILENAME and not why.startswith("a directory"):
            notes.append(f"skipped {name}: {why}: whether it is a trace cannot be told")
    return traces, unreadable, notes


def _not_a_plain_file(path: str) -> str | None:
    """Why ``path`` cannot be read as a file (without opening it); None for a regular file."""
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "a symlink loop, not read"
        if os.path.islink(path):
            with contextlib.suppress(OSError):
                return f"a dangling symlink (to {os.readlink(path)}), not read"
            return "a dangling symlink, not read"
        return f"cannot be looked at: {describe_os_error(err)}"
    if stat.S_ISREG(mode):
        return None
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))
    kind = next((word for test, word in kinds if test(mode)), "a device")
    return f"{kind}, not a regular file: not read"


def build_report(
    path: str,
    top: int = DEFAULT_TOP,
    jobs: int | None = None,
    notices: list[str] | None = None,
    alignment: str = TB_ALIGNMENT,
    skip: Callable[[str], str | None] = lambda _: None,
) -> dict[str, Any]:
    """The report as plain JSON-ready data (what ``--format json`` prints). ``path``: a folder or one trace.
    ``jobs``: processes reading the traces at once (default: the usable cores; 1: in this process; capped at
    the usable cores and at the number of traces); the traces come ordered by rank (then by name), whatever
    ``jobs``. ``notices``, when given, gets how the report was made (a capped ``jobs``): for the command's
    stderr, not the report, which is the same whatever ``jobs``. ``alignment``: how kernels are assigned to steps
    (:func:`~lightning_perf.traces.figures.breakdown.step_breakdown`: torch-tb-profiler's time cut, or "launch").
    ``skip``: why a folder's file is not read (:func:`scan_folder`)."""
    jobs = check_jobs(jobs)
    if alignment not in ALIGNMENTS:
        raise ReportError(f"--alignment must be one of {', '.join(ALIGNMENTS)}, got {alignment!r}")
    run_dir, traces, skipped, notes = _inputs(path, skip)
    summary_path = os.path.join(run_dir, SUMMARY_FILENAME)
    summary, unreadable = _read_summary(summary_path)
    unreadable += skipped
    if not os.path.lexists(summary_path) and not traces and not skipped:
        raise ReportError(f"{path}: no trace files (*.json[.gz] with traceEvents) and no {SUMMARY_FILENAME}")
    sections = []
    analyse = functools.partial(
        analyse_or_fail,
        top=top,
        with_input_rule=summary is None,
        alignment=alignment,
        settings=summary.settings if summary is not None else None,
    )
    used, capped = capped_jobs(jobs, len(traces))
    if capped is not None and notices is not None:
        notices.append(capped)
    # one bad trace does not hide the good ones
    for trace, ok, result in map_traces(analyse, traces, used, errors=(TraceError, OSError)):
        if ok:
            sections.append(result)
        else:
            unreadable.append(
                {"file": os.path.basename(trace), "rank": unreadable_rank(trace), "error": result}
            )
    sections.sort(key=_by_rank)  # stable: a rank's cycles stay in name (time) order
    if summary is None and not sections:
        raise ReportError(f"{path}: nothing readable: " + "; ".join(u["error"] for u in unreadable))
    if summary is None and not unreadable:
        notes.append(f"no {SUMMARY_FILENAME} in {run_dir}: findings come from the traces alone")
    if not traces:
        notes.append(
            f"no trace files (*.json[.gz] with traceEvents) in {run_dir}: reporting the summary alone"
        )
    runs = group_runs(sections)
    if len(runs) > 1:
        notes.append(mixed_runs_note(run_dir, runs))
    return {
        "schema": REPORT_SCHEMA,
        "schema_version": REPORT_SCHEMA_VERSION,
        "run_dir": path,
        "summary": _summary_section(summary, summary_path) if summary is not None else None,
        "notes": notes,
        "traces": sections,
        # one cross-rank view a run: the ranks of two runs side by side would compare unrelated steps
        "ranks": rank_spread(sections) if len(runs) <= 1 else None,
        "runs": [run_entry(number, size, group) for number, (size, group) in enumerate(runs, 1)]
        if len(runs) > 1
        else [],
        "changes": [change for _, group in runs for change in cycle_changes(group)],
        "unreadable": unreadable,
        "findings": [finding_dict(f) for f in summary_findings(summary, sections)]
        if summary is not None
        else [],
    }


def _inputs(
    path: str, skip: Callable[[str], str | None]
) -> tuple[str, list[str], list[dict[str, Any]], list[str]]:
    """(run dir, traces, skipped files, notes) of a report on ``path``, a folder or one trace; ReportError when
    ``path`` is neither."""
    skipped: list[dict[str, Any]] = []
    notes: list[str] = []
    if os.path.isfile(path):
        if not is_trace_file(path):
            raise ReportError(f"{path}: not a Chrome/Kineto trace (no traceEvents)")
        run_dir, traces = os.path.dirname(path) or ".", [path]
    elif os.path.isdir(path):
        run_dir = path
        traces, skipped, notes = scan_folder(path, skip)
    elif os.path.lexists(path):  # a dangling link, a FIFO, a socket
        raise ReportError(f"{path}: {_not_a_plain_file(path)}")
    else:
        raise ReportError(f"{path}: no such file or directory")
    return run_dir, traces, skipped, notes


def _read_summary(summary_path: str) -> tuple[RunSummary | None, list[dict[str, Any]]]:
    """The run's summary, None when there is none or it cannot be read; then the unreadable entry saying why."""
    unreadable: list[dict[str, Any]] = []
    summary = None
    summary_problem = _not_a_plain_file(summary_path) if os.path.lexists(summary_path) else None
    if summary_problem is not None:
        unreadable.append({"file": SUMMARY_FILENAME, "error": f"{summary_path}: {summary_problem}"})
    elif os.path.exists(summary_path):
        try:
            summary = RunSummary.load(summary_path)
        except SummaryError as err:
            unreadable.append({"file": SUMMARY_FILENAME, "error": str(err)})
    return summary, unreadable


def _by_rank(section: dict[str, Any]) -> tuple[bool, int]:
    rank = section["rank"]
    return (rank is None, rank or 0)


def figures_section(figures: TraceFigures) -> dict[str, Any]:
    """The figures as JSON-ready data, floats rounded for reading."""
    data = dataclasses.asdict(figures)
    data.pop("source")
    for own in ("top_operators", "top_kernels"):  # the report lists its own (top_cpu_operators, top_kernels)
        data.pop(own)
    return _rounded(data)


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def is_training(names: Iterable[str]) -> bool:
    """Whether operator or kernel ``names`` (one each, not one an event) show a training step: a backward
    pass or an optimizer step (TRAINING_MARKS)."""
    return any(mark in str(name).lower() for name in names for mark in TRAINING_MARKS)


def analyse_or_fail(
    path: str,
    top: int = DEFAULT_TOP,
    with_input_rule: bool = True,
    alignment: str = TB_ALIGNMENT,
    settings: Settings | None = None,
) -> dict[str, Any]:
    """:func:`analyse_trace`, any error of the analysis made a :class:`TraceError` naming the file and the error,
    so that it costs this trace, not the report (in a worker or in this process)."""
    try:
        return analyse_trace(
            path, top=top, with_input_rule=with_input_rule, alignment=alignment, settings=settings
        )
    except (TraceError, OSError):
        raise
    except Exception as err:  # a trace the analysis fails on: an unreadable trace, not a failed report
        raise TraceError(f"{path}: cannot be analysed: {type(err).__name__}: {err}") from err


@gc_paused()
def analyse_trace(
    path: str,
    top: int = DEFAULT_TOP,
    with_input_rule: bool = True,
    alignment: str = TB_ALIGNMENT,
    settings: Settings | None = None,
) -> dict[str, Any]:
    """One trace file's section of the report. :class:`TraceError` naming the file on bad input.
    ``with_input_rule=False`` leaves the input-bound verdict to the run summary; ``settings``: the run summary's
    (the precision and TF32 settings decide the tensor-core shares where the trace cannot)."""
    parsed = load_trace(path)
    breakdown = step_breakdown(parsed.columns, alignment)
    figures = trace_figures(parsed, breakdown)
    with_run_settings(figures, settings)
    figures.modules = module_times(parsed.columns, len(breakdown.steps))  # [] unless PerfCallback named them
    operators, kernels = cpu_operator_stats(parsed.columns), kernel_stats(parsed.columns)
    training = is_training(s.name for s in (*operators, *kernels))
    found = diagnose_trace(figures, training=training, settings=settings)
    findings = [f for f in found if with_input_rule or f.id != "input_bound"]
    steps = breakdown.steps
    average = breakdown.average()
    info = parsed.metadata.get("distributedInfo")
    return {
        "path": path,
        "file": os.path.basename(path),
        "rank": parsed.rank,
        "world_size": info.get("world_size") if isinstance(info, dict) else None,
        # what tells two runs of one world size apart (traces/report/runs.py): the process that ran the steps
        "process": _first_step_process(parsed.columns),
        "started_us": steps[0].start if steps else None,
        "backend": info.get("backend") if isinstance(info, dict) else None,
        "events": parsed.event_count,
        "skipped_events": parsed.skipped_events,
        "skip_reason": parsed.skip_reason,
        "steps": [
            {
                "step": s.step,
                "duration_ms": _ms(s.duration),
                "categories_ms": {c: _ms(s.categories[c]) for c in CATEGORIES},
            }
            for s in steps
        ],
        "average": {
            "steps": len(steps),
            "duration_ms": _ms(average["total"]),
            "categories_ms": {c: _ms(average[c]) for c in CATEGORIES},
            "categories_pct": {c: _pct(average[c], average["total"]) for c in CATEGORIES},
        }
        if steps
        else None,
        "device_aligned": breakdown.device_aligned,
        "alignment": alignment,
        "overlapping_steps": breakdown.overlapping,
        "dropped_tail_steps": breakdown.dropped_tail_steps,
        # the default window (host ProfilerStep spans), as the callback computes it for TensorBoard and the
        # summary, so the two figures agree; the plugin's own window also covers the last step's GPU tail
        "kernel_busy_pct": _round(kernel_busy_pct(parsed.columns)),
        "top_cpu_operators": [_operator(s) for s in operators[:top]],
        "top_kernels": [_operator(s) for s in kernels[:top]],
        "figures": {**figures_section(figures), "training": training},
        "findings": [finding_dict(f) for f in findings],
    }


def _first_step_process(cols: SpanColumns) -> Any:
    """The pid of the first span (in file order) named ProfilerStep#: the process that ran the steps."""
    steps = np.flatnonzero(cols.where_name(lambda name: name.startswith("ProfilerStep#")))
    return cols.picked(steps[:1])[0].pid if len(steps) else None


def _summary_section(summary: RunSummary, path: str) -> dict[str, Any]:
    timing = summary.timing
    gpu = summary.utilization.gpu
    return {
        "path": path,
        "run_name": summary.run_name,
        "status": summary.status,
        "stage": summary.stage,
        "world_size": summary.world_size,
        "steps": timing.steps,
        "step_time_ms_mean": _round(timing.step_time_ms.mean) if timing.step_time_ms else None,
        "data_wait_pct": _round(timing.data_wait_pct),
        "samples_per_sec": _round(timing.samples_per_sec),
        "gpu_kernel_busy_pct": _round(gpu.kernel_busy_pct) if gpu else None,
    }


def _operator(stat: OperatorStat) -> dict[str, Any]:
    return {
        "name": stat.name,
        "calls": stat.calls,
        "self_ms": _ms(stat.self_us),
        "total_ms": _ms(stat.total_us),
    }


def _ms(us: float) -> float | None:
    return _round(us / _US_PER_MS, 3)


def _pct(part: float, whole: float) -> float | None:
    return _round(100.0 * part / whole) if whole > 0 else None


def _round(value: float | None, digits: int = 1) -> float | None:
    # sums of absurd (finite) times can overflow: shown as "-" rather than inf or nan
    return None if value is None or not math.isfinite(value) else round(value, digits)
