"""Rendering a :class:`~lightning_perf.analysis.verdicts.comparison.Comparison`: text and markdown tables, JSON.

Pure. Every timing's cell shows the value with its own 95% interval in brackets and, beside it, the change
against the baseline with the interval of the ratio; the method behind the verdict is printed under it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from lightning_perf.analysis.verdicts import hparams_diff
from lightning_perf.analysis.verdicts.comparison import (
    DEFAULT_DECIMALS,
    JSON_SCHEMA_NAME,
    JSON_SCHEMA_VERSION,
    RATIO_DECIMALS,
    SPEED_UNITS,
    UNIT_DECIMALS,
    Comparison,
    MetricRow,
    arrow_text,
    factor_text,
    format_value,
    plain_text,
)
from lightning_perf.analysis.verdicts.statistics import FASTER, NO_DIFFERENCE, MetricChange


def change_note(before: float | None, after: float | None, unit: str, better: str | None) -> str:
    """How ``after`` differs from ``before``: ``1.67x faster``, ``-41.9 pts, better``; "" if unknown."""
    if before is None or after is None:
        return ""
    if unit == "%":
        # a ratio of two shares misleads (1% -> 3% is "3x"); percentage points do not
        decimals = UNIT_DECIMALS["%"]
        delta = after - before
        if f"{abs(delta):.{decimals}f}" == f"{0:.{decimals}f}":
            return "about the same"
        return f"{delta:+.{decimals}f} pts{_judgement(delta, better)}"
    if before <= 0 or after <= 0:
        return ""
    factor = factor_text(before, after)
    if factor == factor_text(1.0, 1.0):
        return "about the same"
    increased = after > before
    if unit in SPEED_UNITS and better is not None:
        improved = increased == (better == "higher")
        return f"{factor} {'faster' if improved else 'slower'}"
    return f"{factor} {'higher' if increased else 'lower'}{_judgement(after - before, better)}"


def _judgement(delta: float, better: str | None) -> str:
    if better is None:
        return ""
    improved = (delta > 0) == (better == "higher")
    return ", better" if improved else ", worse"


def format_change(
    label: str, before: float | None, after: float | None, unit: str, better: str | None
) -> str:
    """``step time 100.0 ms -> 60.0 ms, 1.67x faster`` (no judgement when a value is absent)."""
    note = change_note(before, after, unit, better)
    arrow = arrow_text(label, before, after, unit)
    return f"{arrow}, {note}" if note else arrow


def _cells(c: Comparison, row: MetricRow) -> list[str]:
    """``60.0 ms [58.1-61.9] (1.67x faster, 1.60-1.74x)``: value, its own interval, the change and its interval."""
    base = row.values[c.baseline_index]
    cells = []
    for i, value in enumerate(row.values):
        cell = format_value(value, row.unit)
        interval = row.intervals[i] if i < len(row.intervals) else None
        if interval is not None and value is not None:
            decimals = UNIT_DECIMALS.get(row.unit, DEFAULT_DECIMALS)
            cell += f" [{interval[0]:.{decimals}f}-{interval[1]:.{decimals}f}]"
        change = row.changes[i] if i < len(row.changes) else None
        if i == c.baseline_index:
            note = ""
        elif change is not None:
            note = change_cell(change)
        else:
            note = change_note(base, value, row.unit, row.better)
        cells.append(f"{cell} ({note})" if note else cell)
    return cells


def change_cell(change: MetricChange) -> str:
    """``1.67x faster, 1.60-1.74x`` or ``no measurable difference, 0.97-1.05x`` (the ratio's interval)."""
    bounds = f"{change.low:.{RATIO_DECIMALS}f}-{change.high:.{RATIO_DECIMALS}f}x"
    if not change.significant:
        return f"{NO_DIFFERENCE}, {bounds}"
    factor = 1.0 / change.ratio if change.verdict == FASTER else change.ratio
    return f"{factor:.{RATIO_DECIMALS}f}x {change.verdict}, {bounds}"


def _baseline_marker(c: Comparison, name: str) -> str:
    # a run already named "baseline" needs no marker
    return " (baseline)" if name == c.baseline != "baseline" else ""


def _headers(c: Comparison) -> list[str]:
    return [name + _baseline_marker(c, name) for name in c.run_names]


def render_text(c: Comparison) -> str:
    """A plain-text table: settings that differ, metrics with their change vs the baseline, the verdict."""
    rows: list[list[str]] = [["", *_headers(c)]]
    sections: list[int] = []  # row indexes that start a section (printed as a title line)
    if c.settings_diff:
        sections.append(len(rows))
        rows.append(["settings that differ"])
        rows += [[f"  {key}", *(plain_text(v) for v in values)] for key, values in c.settings_diff.items()]
    sections += [len(rows)] if c.hparams_diff else []
    rows += hparams_diff.text_rows(c.hparams_diff)
    sections.append(len(rows))
    rows.append(["metrics"])
    rows += [[f"  {row.label}", *_cells(c, row)] for row in c.metrics]
    widths = [max(len(r[col]) for r in rows if len(r) > col) for col in range(len(rows[0]))]
    lines = [f"Comparison of {len(c.run_names)} runs (baseline: {c.baseline})", ""]
    for i, r in enumerate(rows):
        lines.append(
            r[0]
            if i in sections
            else "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
        )
    if not c.settings_diff and not c.hparams_diff:
        lines.append(
            "(the runs differ only in what the settings fingerprint does not record, e.g. code or transforms)"
            if c.variants_differ
            else "(no settings differ between the runs)"
        )
    lines += ["", *c.warnings, f"verdict: {c.verdict}", *_method_lines(c)]
    return "\n".join(lines) + "\n"


def _method_lines(c: Comparison) -> list[str]:
    if not c.method:
        return []
    return [
        f"method: {c.method}",
        "how to read: [a-b] after a value is its 95% interval; a change's interval is of the ratio run/baseline "
        "(below 1: less time); 'no measurable difference' means the interval holds 1",
    ]


def _md(text: str) -> str:
    # code spans keep underscores in run and setting names from turning into emphasis
    return "`" + text.replace("`", "'") + "`"


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    def line(cells: list[str]) -> str:
        # a pipe would split the cell, even inside a code span
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    return [line(header), "|" + "---|" * len(header), *(line(r) for r in rows)]


def render_markdown(c: Comparison) -> str:
    """The same content as :func:`render_text` as GitHub/TensorBoard markdown."""
    names = [_md(name) + _baseline_marker(c, name) for name in c.run_names]
    lines = [f"### Performance comparison ({len(c.run_names)} runs, baseline {_md(c.baseline)})", ""]
    lines += [f"> **{w}**" if w.startswith("warning") else f"> {w}" for w in c.warnings]
    if c.warnings:
        lines.append("")
    lines += [f"**Verdict:** {c.verdict}", ""]
    lines += [f"_{line}_" for line in _method_lines(c)] + ([""] if c.method else [])
    if c.settings_diff:
        settings = [[_md(key), *(_md(plain_text(v)) for v in vals)] for key, vals in c.settings_diff.items()]
        lines += _md_table(["setting", *names], settings) + [""]
    elif not c.hparams_diff:
        lines += ["No settings differ between the runs.", ""]
    lines += hparams_diff.markdown_lines(c.hparams_diff, names)
    lines += _md_table(["metric", *names], [[row.label, *_cells(c, row)] for row in c.metrics])
    return "\n".join(lines) + "\n"


def to_json(c: Comparison) -> dict[str, Any]:
    """A JSON-ready dict with stable keys (every key always present; absent values are null)."""
    return {
        "schema": JSON_SCHEMA_NAME,
        "schema_version": JSON_SCHEMA_VERSION,
        "run_names": list(c.run_names),
        "baseline": c.baseline,
        "settings_diff": {k: list(v) for k, v in c.settings_diff.items()},
        "environment_diff": {k: list(v) for k, v in c.environment_diff.items()},
        "metrics": [dataclasses.asdict(row) for row in c.metrics],
        "verdict": c.verdict,
        "slower_than_baseline": dict(c.slower_than_baseline),
        "warnings": list(c.warnings),
        "changes": {name: dataclasses.asdict(change) for name, change in c.changes.items()},
        "method": c.method,
        "rounds": c.rounds,
        "variants_differ": c.variants_differ,
        "hparams_diff": {k: list(v) for k, v in c.hparams_diff.items()},
    }


def from_json(data: dict[str, Any]) -> Comparison:
    """Inverse of :func:`to_json`."""
    if not isinstance(data, dict) or data.get("schema") != JSON_SCHEMA_NAME:
        raise ValueError(f"not a lightning-perf comparison (no schema {JSON_SCHEMA_NAME!r})")
    if data.get("schema_version") != JSON_SCHEMA_VERSION:
        raise ValueError(
            f"comparison schema_version {data.get('schema_version')!r} is not supported "
            f"(this version reads {JSON_SCHEMA_VERSION})"
        )
    return Comparison(
        run_names=list(data["run_names"]),
        baseline=data["baseline"],
        settings_diff={k: list(v) for k, v in data["settings_diff"].items()},
        environment_diff={k: list(v) for k, v in data["environment_diff"].items()},
        metrics=[_metric_row_from_json(row) for row in data["metrics"]],
        verdict=data["verdict"],
        slower_than_baseline=dict(data["slower_than_baseline"]),
        warnings=list(data["warnings"]),
        changes={name: MetricChange(**change) for name, change in data["changes"].items()},
        method=data["method"],
        rounds=data["rounds"],
        variants_differ=bool(data.get("variants_differ", False)),
        hparams_diff={k: list(v) for k, v in data.get("hparams_diff", {}).items()},
    )


def _metric_row_from_json(row: dict[str, Any]) -> MetricRow:
    changes = [None if change is None else MetricChange(**change) for change in row.get("changes", [])]
    return MetricRow(**{**row, "changes": changes})
