"""Rendering of the ``lightning-perf report`` data (:func:`lightning_perf.traces.report.build.build_report`) as text,
Markdown or JSON."""

from __future__ import annotations

import json
from typing import Any

from lightning_perf.analysis.summary import SUMMARY_FILENAME
from lightning_perf.traces.figures.breakdown import CATEGORIES, CATEGORY_LABELS
from lightning_perf.traces.report.changes import change_rows, change_title
from lightning_perf.traces.report.figures import figure_lines, spread_rows

NAME_WIDTH = 80


def render_json(report: dict[str, Any], detail: set[int] | None = None) -> str:
    """Every trace and figure, whatever ``detail`` says (JSON keeps everything)."""
    return json.dumps(report, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def _unreadable_lines(report: dict[str, Any]) -> list[str]:
    return [
        "Unreadable: "
        + ("" if bad.get("rank") is None else f"rank {bad['rank']}: ")
        + f"{bad['file']}: {bad['error']}"
        for bad in report.get("unreadable", [])
    ]


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


def _module_rows(modules: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    header = ["Forward", "Backward", "Self", "Total", "GPU", "Calls", "Module"]
    return header, [
        [
            _fmt(m["forward_self_ms"]),
            _fmt(m["backward_self_ms"]),
            _fmt(m["forward_self_ms"] + m["backward_self_ms"]),
            _fmt(m["forward_ms"] + m["backward_ms"]),
            _fmt(m["gpu_forward_ms"] + m["gpu_backward_ms"]),
            str(m["calls"]),
            _short(m["path"]),
        ]
        for m in modules
    ]


def _steps_unknown(trace: dict[str, Any]) -> bool:
    """No ProfilerStep in the trace (a GPU-only or unscheduled one): its one step is the whole trace."""
    return bool(trace["steps"]) and all(step["step"] is None for step in trace["steps"])


def _busy_line(trace: dict[str, Any]) -> str:
    if trace["kernel_busy_pct"] is None:
        return "GPU kernel-busy: no GPU kernels recorded"
    if _steps_unknown(trace):
        return f"GPU kernel-busy: a kernel ran during {trace['kernel_busy_pct']:.1f}% of the trace (no ProfilerStep spans)"
    return (
        f"GPU kernel-busy: a kernel ran during {trace['kernel_busy_pct']:.1f}% of the profiled steps "
        "(first ProfilerStep start to last ProfilerStep end)"
    )


def _trace_title(trace: dict[str, Any]) -> str:
    rank = "" if trace["rank"] is None else f", rank {trace['rank']}"
    steps = "steps unknown" if _steps_unknown(trace) else f"{len(trace['steps'])} steps"
    return f"Trace {trace['file']} ({steps}{rank}, {trace['events']} events)"


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
    if trace["figures"].get("training") is False:
        notes.append(
            "no backward pass or optimizer step in this trace: a forward-only run (serving, evaluation), "
            "not training"
        )
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


def _by_rank(report: dict[str, Any], detail: set[int] | None) -> list[dict[str, Any]]:
    """The traces to detail, sorted by rank (traces without a rank last, by name); ``detail``: the ranks to keep
    (None: all; a trace without a rank is always kept)."""
    traces = sorted(report["traces"], key=lambda t: (t["rank"] is None, t["rank"] or 0, t["file"]))
    return [t for t in traces if detail is None or t["rank"] is None or t["rank"] in detail]


def _standout_line(report: dict[str, Any], detail: set[int]) -> str:
    standout = report["ranks"].get("standout", {})
    roles = ", ".join(f"rank {rank} ({_role(role)})" for role, rank in standout.items())
    extra = sorted(detail - set(standout.values()))
    chosen = f"; chosen: {', '.join(f'rank {r}' for r in extra)}" if extra else ""
    return (
        f"Details of the ranks that stand out: {roles}{chosen}.{_standout_by(report['ranks'])} Others: "
        "`--rank N` (repeatable) or `--all-ranks`; `--format json` has every rank."
    )


def _role(role: str) -> str:
    return role.replace("_", " ")


# what each column of the cross-rank table that backs a label says
_COLUMN_WORDS = {
    "non-comm ms": "by non-comm ms (step ms less exposed comm ms)",
    "exposed comm ms": "by the least exposed comm ms (the others wait for it in collectives)",
    "wait ms": "by wait ms (exposed comm ms above the waited-for rank's)",
}


def _standout_by(ranks: dict[str, Any]) -> str:
    """The column of the cross-rank table each label is read from: " Slowest, median by non-comm ms (...)."."""
    by: dict[str, list[str]] = {}
    for role, column in ranks.get("standout_by", {}).items():
        by.setdefault(column, []).append(_role(role))
    parts = [
        f"{', '.join(roles)} {_COLUMN_WORDS.get(column, 'by ' + column)}" for column, roles in by.items()
    ]
    text = "; ".join(parts)
    return f" {text[:1].upper()}{text[1:]}." if parts else ""


def _cross_rank_text(report: dict[str, Any]) -> list[str]:
    ranks = report["ranks"]
    out = ["", "Across ranks:"] + _text_table(*spread_rows(ranks), indent="  ")
    findings = ranks.get("findings", [])
    out.append("Cross-rank findings:" if findings else "Cross-rank findings: none")
    return out + _text_findings(findings, "  ")


def _trace_text(trace: dict[str, Any]) -> list[str]:
    out = ["", _trace_title(trace)]
    out += [f"  Note: {note}" for note in _trace_notes(trace)]
    if trace["steps"]:
        out.append("  Step breakdown (ms):")
        out += _text_table(*_step_rows(trace), indent="    ")
    out.append("  " + _busy_line(trace))
    out += ["  " + line for line in figure_lines(trace)]
    for title, key in (
        ("CPU operators by self time", "top_cpu_operators"),
        ("GPU kernels", "top_kernels"),
    ):
        if trace[key]:
            out.append(f"  Top {len(trace[key])} {title}:")
            out += _text_table(*_operator_rows(trace[key]), indent="    ")
    modules = trace["figures"].get("modules")
    if modules:
        out.append(f"  Top {len(modules)} modules of the model by self time (ms a step):")
        out += _text_table(*_module_rows(modules), indent="    ")
    out.append("  Findings from this trace:" if trace["findings"] else "  Findings from this trace: none")
    return out + _text_findings(trace["findings"], "    ")


def render_text(report: dict[str, Any], detail: set[int] | None = None) -> str:
    """The report as text. ``detail``: the ranks whose traces are shown in full, after the cross-rank view
    (:func:`lightning_perf.traces.report.ranks.detailed_ranks`); None: every trace, then the cross-rank view."""
    out = [f"lightning-perf report: {report['run_dir']}"]
    if report["summary"]:
        out.append(_summary_line(report["summary"]))
    out += [f"Note: {note}" for note in report["notes"]]
    out += _unreadable_lines(report)
    if detail is not None and report["ranks"]:
        out += _cross_rank_text(report) + ["", _standout_line(report, detail)]
    for trace in _by_rank(report, detail):
        out += _trace_text(trace)
    if detail is None and report["ranks"]:
        out += _cross_rank_text(report)
    for change in report.get("changes") or []:  # extra cycles (slowdown, capture) beside the first one
        out += ["", change_title(change) + ":"] + _text_table(*change_rows(change), indent="  ")
    if report["summary"]:
        out += ["", "Findings:" if report["findings"] else f"Findings: none in {SUMMARY_FILENAME}"]
        out += _text_findings(report["findings"], "  ")
    return "\n".join(out) + "\n"


def _text_findings(findings: list[dict[str, Any]], indent: str) -> list[str]:
    out = []
    for f in findings:
        out.append(f"{indent}[{f['severity']}] {f['title']} ({f['id']})")
        out.append(f"{indent}  Evidence: {f['evidence']}")
        out.append(f"{indent}  Recommendation: {f['recommendation']}")
    return out


def _md_findings(findings: list[dict[str, Any]]) -> list[str]:
    out = []
    for f in findings:
        out += [f"- **[{_md_cell(f['severity'])}] {_md_cell(f['title'])}** (`{f['id']}`)"]
        out += [
            f"  - Evidence: {_md_cell(f['evidence'])}",
            f"  - Recommendation: {_md_cell(f['recommendation'])}",
        ]
    return out


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


def _cross_rank_md(report: dict[str, Any]) -> list[str]:
    ranks = report["ranks"]
    out = ["", "## Across ranks", ""] + _md_table(*spread_rows(ranks))
    out += ["", "### Cross-rank findings", ""]
    return out + (_md_findings(ranks.get("findings", [])) or ["None."])


def _trace_md(trace: dict[str, Any]) -> list[str]:
    out = ["", f"## {_md_cell(_trace_title(trace))}", ""]
    out += [f"> Note: {_md_cell(note)}" for note in _trace_notes(trace)]
    if trace["steps"]:
        out += ["### Step breakdown (ms)", ""] + _md_table(*_step_rows(trace)) + [""]
    out += [_busy_line(trace), ""]
    out += [f"- {_md_cell(line)}" for line in figure_lines(trace)] + [""]
    for title, key in (
        ("CPU operators by self time", "top_cpu_operators"),
        ("GPU kernels", "top_kernels"),
    ):
        if trace[key]:
            out += [f"### Top {len(trace[key])} {title}", ""] + _md_table(*_operator_rows(trace[key])) + [""]
    return out + ["### Findings from this trace", ""] + (_md_findings(trace["findings"]) or ["None."]) + [""]


def render_markdown(report: dict[str, Any], detail: set[int] | None = None) -> str:
    """The report as Markdown; ``detail`` as for :func:`render_text`."""
    out = [f"# lightning-perf report: {_md_cell(report['run_dir'])}", ""]
    if report["summary"]:
        out += [_md_cell(_summary_line(report["summary"])), ""]
    out += [f"> Note: {_md_cell(note)}" for note in report["notes"]]
    out += [f"> {_md_cell(line)}" for line in _unreadable_lines(report)]
    if detail is not None and report["ranks"]:
        out += _cross_rank_md(report) + ["", _md_cell(_standout_line(report, detail))]
    for trace in _by_rank(report, detail):
        out += _trace_md(trace)
    if detail is None and report["ranks"]:
        out += _cross_rank_md(report)
    for change in report.get("changes") or []:
        out += ["", f"## {_md_cell(change_title(change))}", ""] + _md_table(*change_rows(change))
    if report["summary"]:
        out += ["", "## Findings", ""]
        if not report["findings"]:
            out.append(f"None in {SUMMARY_FILENAME}.")
        out += _md_findings(report["findings"])
    return "\n".join(out).rstrip("\n") + "\n"
