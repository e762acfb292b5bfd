"""``lightning-perf report RUN_DIR``: what a run's profiler traces and diagnosis say, in one page.

For every ``*.pt.trace.json[.gz]`` in RUN_DIR (one profiled cycle each): the time of each ProfilerStep split
into torch-tb-profiler's Overview categories (DataLoader, CPU Exec, Kernel, Memcpy, Memset, Communication,
Runtime, Other; see :func:`lightning_perf.traces.analysis.step_breakdown`) and their averages, the top
operators by self time (CPU, and GPU kernels when recorded) and the GPU kernel-busy share. Then the findings
of ``perf_summary.json`` when there is one. ``--format json`` is machine-readable with stable keys.

Unreadable files (a cut trace, a corrupt summary) are listed with their error under ``unreadable`` and the
readable ones reported. Exit codes: 0 ok; 1 some files unreadable; 2 for a missing RUN_DIR, a RUN_DIR with
neither traces nor summary, or nothing readable in it.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from lightning_perf.analysis.summary import SUMMARY_FILENAME, Finding, RunSummary, SummaryError
from lightning_perf.errors import LightningPerfError
from lightning_perf.traces.analysis import (
    CATEGORIES,
    CATEGORY_LABELS,
    OperatorStat,
    cpu_operator_stats,
    kernel_busy_pct,
    kernel_stats,
    load_trace,
    step_breakdown,
)
from lightning_perf.traces.reader import TraceError

TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")
DEFAULT_TOP = 10
REPORT_SCHEMA = "lightning-perf/report"
REPORT_SCHEMA_VERSION = 1
# Kernel names are C++ template instantiations of several hundred characters; tables show the start.
NAME_WIDTH = 80
_US_PER_MS = 1000.0


class ReportError(LightningPerfError):
    """The report cannot be made; the message says why and names the path."""


def find_traces(run_dir: str) -> list[str]:
    """The trace files directly in ``run_dir``, sorted by name (worker, then cycle timestamp)."""
    names = sorted(name for name in os.listdir(run_dir) if name.endswith(TRACE_SUFFIXES))
    return [os.path.join(run_dir, name) for name in names if os.path.isfile(os.path.join(run_dir, name))]


def build_report(run_dir: str, top: int = DEFAULT_TOP) -> dict[str, Any]:
    """The report as plain JSON-ready data (what ``--format json`` prints)."""
    if not os.path.isdir(run_dir):
        raise ReportError(f"{run_dir}: no such directory")
    notes: list[str] = []
    unreadable: list[dict[str, str]] = []
    summary_path = os.path.join(run_dir, SUMMARY_FILENAME)
    summary = None
    if os.path.exists(summary_path):
        try:
            summary = RunSummary.load(summary_path)
        except SummaryError as err:
            unreadable.append({"file": SUMMARY_FILENAME, "error": str(err)})
    traces = find_traces(run_dir)
    if not os.path.exists(summary_path) and not traces:
        raise ReportError(
            f"{run_dir}: no *.pt.trace.json[.gz] files and no {SUMMARY_FILENAME}: not a run dir?"
        )
    sections = []
    for path in traces:
        try:
            sections.append(analyse_trace(path, top))
        except (TraceError, OSError) as err:  # one bad trace does not hide the good ones
            unreadable.append({"file": os.path.basename(path), "error": str(err)})
    if summary is None and not sections:
        raise ReportError(f"{run_dir}: nothing readable: " + "; ".join(u["error"] for u in unreadable))
    if summary is None and not unreadable:
        notes.append(f"no {SUMMARY_FILENAME} in {run_dir}: reporting the traces alone (no findings)")
    if not traces:
        notes.append(f"no *.pt.trace.json[.gz] files in {run_dir}: reporting the summary alone")
    return {
        "schema": REPORT_SCHEMA,
        "schema_version": REPORT_SCHEMA_VERSION,
        "run_dir": run_dir,
        "summary": _summary_section(summary, summary_path) if summary is not None else None,
        "notes": notes,
        "traces": sections,
        "unreadable": unreadable,
        "findings": [_finding(f) for f in summary.findings] if summary is not None else [],
    }


def analyse_trace(path: str, top: int = DEFAULT_TOP) -> dict[str, Any]:
    """One trace file's section of the report. :class:`TraceError` naming the file on bad input."""
    parsed = load_trace(path)
    breakdown = step_breakdown(parsed.spans)
    steps = breakdown.steps
    average = breakdown.average()
    info = parsed.metadata.get("distributedInfo")
    return {
        "path": path,
        "file": os.path.basename(path),
        "rank": parsed.rank,
        "world_size": info.get("world_size") if isinstance(info, dict) else None,
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
        "dropped_tail_steps": breakdown.dropped_tail_steps,
        # the default window (host ProfilerStep spans), as the callback computes it for TensorBoard and the
        # summary, so the two figures agree; the plugin's own window also covers the last step's GPU tail
        "kernel_busy_pct": _round(kernel_busy_pct(parsed.spans)),
        "top_cpu_operators": [_operator(s) for s in cpu_operator_stats(parsed.spans)[:top]],
        "top_kernels": [_operator(s) for s in kernel_stats(parsed.spans)[:top]],
    }


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


def _finding(finding: Finding) -> dict[str, Any]:
    keys = ("id", "severity", "title", "evidence", "recommendation")
    return {key: getattr(finding, key) for key in keys}


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


# ---------------------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------------------


def render_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def _unreadable_lines(report: dict[str, Any]) -> list[str]:
    return [f"Unreadable: {bad['file']}: {bad['error']}" for bad in report.get("unreadable", [])]


def _short(name: str) -> str:
    return name if len(name) <= NAME_WIDTH else name[: NAME_WIDTH - 3] + "..."


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def _step_rows(trace: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["Step", "Total"] + [CATEGORY_LABELS[c] for c in CATEGORIES]
    rows = []
    for step in trace["steps"]:
        label = "all" if step["step"] is None else str(step["step"])
        values = [step["duration_ms"]] + [step["categories_ms"][c] for c in CATEGORIES]
        rows.append([label] + [_fmt(v) for v in values])
    average = trace["average"]
    if average:
        values = [average["duration_ms"]] + [average["categories_ms"][c] for c in CATEGORIES]
        rows.append(["Average"] + [_fmt(v) for v in values])
        rows.append(["Share", "100.0%"] + [_fmt_pct(average["categories_pct"][c]) for c in CATEGORIES])
    return header, rows


def _operator_rows(operators: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    header = ["Self ms", "Total ms", "Calls", "Name"]
    return header, [
        [_fmt(o["self_ms"]), _fmt(o["total_ms"]), str(o["calls"]), _short(o["name"])] for o in operators
    ]


def _busy_line(trace: dict[str, Any]) -> str:
    if trace["kernel_busy_pct"] is None:
        return "GPU kernel-busy: no GPU kernels recorded"
    return (
        f"GPU kernel-busy: a kernel ran during {trace['kernel_busy_pct']:.1f}% of the profiled steps "
        "(first ProfilerStep start to last ProfilerStep end)"
    )


def _trace_title(trace: dict[str, Any]) -> str:
    rank = "" if trace["rank"] is None else f", rank {trace['rank']}"
    return f"Trace {trace['file']} ({len(trace['steps'])} steps{rank}, {trace['events']} events)"


def _trace_notes(trace: dict[str, Any]) -> list[str]:
    notes = []
    if trace["device_aligned"]:
        notes.append("steps extended to the GPU work they launched (as torch-tb-profiler does)")
    if trace["dropped_tail_steps"]:
        notes.append(
            f"{trace['dropped_tail_steps']} last step(s) left out: their kernels look incompletely captured"
        )
    if not trace["steps"]:
        notes.append("no profiled steps in this trace")
    if trace.get("skipped_events"):
        notes.append(
            f"{trace['skipped_events']} event(s) with a missing, negative or non-finite time left out "
            f"(first: {trace['skip_reason']})"
        )
    return notes


def _summary_line(summary: dict[str, Any]) -> str:
    parts = [f"Run {summary['run_name'] or '(unnamed)'}: {summary['stage']}, {summary['status']}"]
    parts.append(f"{summary['steps']} steps")
    if summary["step_time_ms_mean"] is not None:
        parts.append(f"step time {summary['step_time_ms_mean']:.1f} ms mean")
    if summary["data_wait_pct"] is not None:
        parts.append(f"DataLoader wait {summary['data_wait_pct']:.1f}%")
    if summary["samples_per_sec"] is not None:
        parts.append(f"{summary['samples_per_sec']:.1f} samples/s")
    return ", ".join(parts)


def _text_table(header: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    left = _left_aligned(header)

    def line(cells: list[str]) -> str:
        return indent + "  ".join(
            c.ljust(w) if i in left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    return [line(r).rstrip() for r in [header, *rows]]


def render_text(report: dict[str, Any]) -> str:
    out = [f"lightning-perf report: {report['run_dir']}"]
    if report["summary"]:
        out.append(_summary_line(report["summary"]))
    out += [f"Note: {note}" for note in report["notes"]]
    out += _unreadable_lines(report)
    for trace in report["traces"]:
        out += ["", _trace_title(trace)]
        out += [f"  Note: {note}" for note in _trace_notes(trace)]
        if trace["steps"]:
            out.append("  Step breakdown (ms):")
            out += _text_table(*_step_rows(trace), indent="    ")
        out.append("  " + _busy_line(trace))
        for title, key in (
            ("CPU operators by self time", "top_cpu_operators"),
            ("GPU kernels", "top_kernels"),
        ):
            if trace[key]:
                out.append(f"  Top {len(trace[key])} {title}:")
                out += _text_table(*_operator_rows(trace[key]), indent="    ")
    if report["summary"]:
        out += ["", "Findings:" if report["findings"] else f"Findings: none in {SUMMARY_FILENAME}"]
        for f in report["findings"]:
            out.append(f"  [{f['severity']}] {f['title']} ({f['id']})")
            out.append(f"    Evidence: {f['evidence']}")
            out.append(f"    Recommendation: {f['recommendation']}")
    return "\n".join(out) + "\n"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _left_aligned(header: list[str]) -> set[int]:
    # numbers right-aligned; the step label and operator names left-aligned
    return {len(header) - 1} if header[-1] == "Name" else {0}


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    left = _left_aligned(header)
    align = "|" + "|".join("---" if i in left else "---:" for i in range(len(header))) + "|"
    lines = ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in [header, *rows]]
    return [lines[0], align, *lines[1:]]


def render_markdown(report: dict[str, Any]) -> str:
    out = [f"# lightning-perf report: {_md_cell(report['run_dir'])}", ""]
    if report["summary"]:
        out += [_md_cell(_summary_line(report["summary"])), ""]
    out += [f"> Note: {_md_cell(note)}" for note in report["notes"]]
    out += [f"> {_md_cell(line)}" for line in _unreadable_lines(report)]
    for trace in report["traces"]:
        out += ["", f"## {_md_cell(_trace_title(trace))}", ""]
        out += [f"> Note: {_md_cell(note)}" for note in _trace_notes(trace)]
        if trace["steps"]:
            out += ["### Step breakdown (ms)", ""] + _md_table(*_step_rows(trace)) + [""]
        out += [_busy_line(trace), ""]
        for title, key in (
            ("CPU operators by self time", "top_cpu_operators"),
            ("GPU kernels", "top_kernels"),
        ):
            if trace[key]:
                out += (
                    [f"### Top {len(trace[key])} {title}", ""] + _md_table(*_operator_rows(trace[key])) + [""]
                )
    if report["summary"]:
        out += ["", "## Findings", ""]
        if not report["findings"]:
            out.append(f"None in {SUMMARY_FILENAME}.")
        for f in report["findings"]:
            out += [f"- **[{_md_cell(f['severity'])}] {_md_cell(f['title'])}** (`{f['id']}`)"]
            out += [
                f"  - Evidence: {_md_cell(f['evidence'])}",
                f"  - Recommendation: {_md_cell(f['recommendation'])}",
            ]
    return "\n".join(out).rstrip("\n") + "\n"
