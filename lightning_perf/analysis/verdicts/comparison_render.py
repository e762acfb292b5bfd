"""Rendering a :class:`~lightning_perf.analysis.verdicts.comparison.Comparison`: text and markdown tables, JSON.

Pure. Every metric's cell shows the value with its own 95% interval in brackets and, beside it, the change
against the baseline with its interval, both in one direction ("1.40x faster, 1.32-1.49x"); only a significant
change is called faster/slower or better/worse; the method behind the verdict is printed under it.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from lightning_perf.analysis.verdicts import hparams_diff
from lightning_perf.analysis.verdicts.comparison import (
    DEFAULT_DECIMALS,
    JSON_SCHEMA_NAME,
    JSON_SCHEMA_VERSION,
    RATIO_DECIMALS,
    SPEED_UNITS,
    UNIT_DECIMALS,
    CompareError,
    Comparison,
    MetricRow,
    arrow_text,
    factor_text,
    format_value,
    plain_text,
)
from lightning_perf.analysis.verdicts.comparison_metrics import METRICS
from lightning_perf.analysis.verdicts.statistics import (
    NO_DIFFERENCE,
    POINTS,
    RATE,
    RATIO,
    TIME,
    MetricChange,
    fixed,
)

NO_CHANGE = "no measurable change"
_NUMBER = (int, float)
_KIND_WORDS = {dict: "an object", list: "a list", str: "a string", int: "a whole number", _NUMBER: "a number"}


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
        return f"{fixed(delta, decimals, '+')} pts{_judgement(delta, better)}"
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
            cell += f" [{fixed(interval[0], decimals)}-{fixed(interval[1], decimals)}]"
        change = row.changes[i] if i < len(row.changes) else None
        if i == c.baseline_index:
            note = ""
        elif change is not None:
            note = change_cell(change, row.better)
        else:
            note = untested_note(base, value, row.unit, row.key)
        cells.append(f"{cell} ({note})" if note else cell)
    return cells


def untested_note(before: float | None, after: float | None, unit: str, key: str) -> str:
    """A change with no interval: its size, never a judgement (``1.67x lower, no interval``)."""
    note = change_note(before, after, unit, None)  # no "better": sizes only ("1.67x lower", "+2.0 pts")
    if not note or note == "about the same":
        return note
    descriptive = any(spec.key == key and spec.tested is None for spec in METRICS)
    return f"{note}, {'descriptive' if descriptive else 'no interval'}"


def change_cell(change: MetricChange, better: str | None = None) -> str:
    """``1.67x faster, 1.60-1.74x``, ``-41.9 pts, better, -43.0 to -40.8 pts`` or ``no measurable difference:
    estimate 1.03x faster, 0.97-1.10x``: the estimate and its interval in the same direction."""
    bounds = change.interval_text(RATIO_DECIMALS)
    estimate = change.estimate_text(RATIO_DECIMALS)
    if not change.significant:
        none = NO_DIFFERENCE if change.kind in (TIME, RATE) else NO_CHANGE
        return f"{none}: estimate {estimate}, {bounds}"
    if change.kind in (TIME, RATE) or better is None:
        return f"{estimate}, {bounds}"
    went_up = change.direction == "higher"
    return f"{estimate}, {'better' if went_up == (better == 'higher') else 'worse'}, {bounds}"


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
        "how to read: [a-b] after a value is its 95% interval; a change and its interval read the same way "
        "('1.40x faster, 1.32-1.49x'); 'no measurable difference' or 'no measurable change' means the interval "
        "holds no change, and only a measurable change is called faster, slower, better or worse",
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
        "metrics": [_metric_row_to_json(row) for row in c.metrics],
        "verdict": c.verdict,
        "slower_than_baseline": dict(c.slower_than_baseline),
        "warnings": list(c.warnings),
        "changes": {name: change_to_json(change) for name, change in c.changes.items()},
        "method": c.method,
        "rounds": c.rounds,
        "variants_differ": c.variants_differ,
        "hparams_diff": {k: list(v) for k, v in c.hparams_diff.items()},
    }


# A comparison is a few KiB; a file this large is none, and is not read whole.
MAX_COMPARISON_BYTES = 16 << 20


class ComparisonFileError(CompareError, ValueError):
    """A comparison JSON that cannot be read back (:func:`from_json`): the message names the file, when known,
    and the field."""


def load_comparison(path: str) -> Comparison:
    """:func:`from_json` of the comparison JSON file at ``path`` (a trial's ``comparison.json``, what
    ``compare --format json`` printed); :class:`ComparisonFileError` naming the file and the field (or why it
    is no comparison: over MAX_COMPARISON_BYTES, nested too deeply, not UTF-8), OSError when it cannot be read."""
    with open(path, "rb") as fh:
        raw = fh.read(MAX_COMPARISON_BYTES + 1)
    if len(raw) > MAX_COMPARISON_BYTES:
        raise ComparisonFileError(f"{path}: over {MAX_COMPARISON_BYTES >> 20} MiB, not a comparison")
    try:
        data = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise ComparisonFileError(f"{path}: not a comparison: JSON nested too deeply") from None
    except ValueError as err:  # UnicodeDecodeError is one
        raise ComparisonFileError(f"{path}: not JSON: {err}") from None
    try:
        return from_json(data, source=path)
    except ComparisonFileError:
        raise
    except (TypeError, ValueError, AttributeError) as err:  # a field from_json does not check: list(3)
        raise ComparisonFileError(f"{path}: malformed comparison: {err}") from None


def _field(data: Any, key: str, where: str, path: str, kind: type | tuple[type, ...] = object) -> Any:
    """``data[key]``, or :class:`ComparisonFileError` naming the field (``metrics[2].ratios``) and the file."""
    field_name = f"{path}.{key}" if path else key
    if not isinstance(data, dict):
        raise ComparisonFileError(f"{where}malformed comparison: {path}: expected an object")
    if key not in data:
        raise ComparisonFileError(f"{where}malformed comparison: missing field {field_name!r}")
    value = data[key]
    if not isinstance(value, kind) or (kind == _NUMBER and isinstance(value, bool)):
        raise ComparisonFileError(
            f"{where}malformed comparison: {field_name}: expected {_KIND_WORDS.get(kind, 'another type')}, "
            f"got {json.dumps(value, default=repr)[:40]}"
        )
    return value


def from_json(data: dict[str, Any], source: str | None = None) -> Comparison:
    """Inverse of :func:`to_json`. ``source`` (the file it came from) is named in the errors:
    :class:`ComparisonFileError` (a ValueError) naming the missing or malformed field, never a bare KeyError."""
    where = f"{source}: " if source else ""
    if not isinstance(data, dict) or data.get("schema") != JSON_SCHEMA_NAME:
        raise ComparisonFileError(f"{where}not a lightning-perf comparison (no schema {JSON_SCHEMA_NAME!r})")
    if data.get("schema_version") != JSON_SCHEMA_VERSION:
        raise ComparisonFileError(
            f"{where}comparison schema_version {data.get('schema_version')!r} is not supported "
            f"(this version reads {JSON_SCHEMA_VERSION})"
        )

    def get(key: str, kind: type | tuple[type, ...] = object) -> Any:
        return _field(data, key, where, "", kind)

    metrics = get("metrics", list)
    changes = get("changes", dict)
    return Comparison(
        run_names=list(get("run_names", list)),
        baseline=get("baseline", str),
        settings_diff={k: list(v) for k, v in get("settings_diff", dict).items()},
        environment_diff={k: list(v) for k, v in get("environment_diff", dict).items()},
        metrics=[_metric_row_from_json(row, where, f"metrics[{i}]") for i, row in enumerate(metrics)],
        verdict=get("verdict", str),
        slower_than_baseline=dict(get("slower_than_baseline", dict)),
        warnings=list(get("warnings", list)),
        changes={
            name: change_from_json(change, where, f"changes.{name}") for name, change in changes.items()
        },
        method=get("method", str),
        rounds=get("rounds", int),
        variants_differ=bool(data.get("variants_differ", False)),
        hparams_diff={k: list(v) for k, v in data.get("hparams_diff", {}).items()},
    )


# the JSON names of a change's three numbers, by kind (MetricChange.kind)
_VALUE_FIELDS = {TIME: "time_ratio", RATE: "value_ratio", RATIO: "value_ratio", POINTS: "difference_pts"}


def change_to_json(change: MetricChange) -> dict[str, Any]:
    """A change as JSON, its numbers named for what they are and for their direction.

    Always: ``kind``, ``verdict``, ``significant``, ``direction`` ("faster"/"slower"/"higher"/"lower", the
    estimate's), ``factor``/``factor_low``/``factor_high`` (the change in that direction: 1.40 for 1.40x
    faster; points for shares), ``confidence``, ``method``, ``rounds_needed``, and the raw numbers:
    ``time_ratio``/``_low``/``_high`` (run / baseline of a time), ``value_ratio``... (run / baseline of a rate
    or size) or ``difference_pts``... (run - baseline, points). Times and rates add ``speedup``/``_low``/
    ``_high`` and ``slowdown``/``_low``/``_high``: the one in the estimate's direction is filled, the other null.
    """
    name = _VALUE_FIELDS[change.kind]
    data: dict[str, Any] = {
        "kind": change.kind,
        "verdict": change.verdict,
        "significant": change.significant,
        "direction": change.direction,
        "factor": change.factor,
        "factor_low": change.factor_low,
        "factor_high": change.factor_high,
        name: change.ratio,
        f"{name}_low": change.low,
        f"{name}_high": change.high,
        "confidence": change.confidence,
        "method": change.method,
        "rounds_needed": change.rounds_needed,
    }
    if change.kind in (TIME, RATE):
        for word, field_name in (("faster", "speedup"), ("slower", "slowdown")):
            here = change.direction == word
            data[field_name] = change.factor if here else None
            data[f"{field_name}_low"] = change.factor_low if here else None
            data[f"{field_name}_high"] = change.factor_high if here else None
    return data


def change_from_json(data: dict[str, Any], where: str = "", path: str = "change") -> MetricChange:
    """Inverse of :func:`change_to_json`; :class:`ComparisonFileError` naming a missing field (``path``, with
    ``where``: the file) or an unknown kind."""
    kind = _field(data, "kind", where, path, str)
    if kind not in _VALUE_FIELDS:
        raise ComparisonFileError(
            f"{where}malformed comparison: {path}.kind: {kind!r} is none of {', '.join(_VALUE_FIELDS)}"
        )
    name = _VALUE_FIELDS[kind]

    def get(key: str, kind: type | tuple[type, ...] = object) -> Any:
        return _field(data, key, where, path, kind)

    return MetricChange(
        ratio=get(name, _NUMBER),
        low=get(f"{name}_low", _NUMBER),
        high=get(f"{name}_high", _NUMBER),
        confidence=get("confidence", _NUMBER),
        verdict=get("verdict", str),
        method=get("method", str),
        rounds_needed=get("rounds_needed"),
        kind=kind,
    )


def _metric_row_to_json(row: MetricRow) -> dict[str, Any]:
    data = dataclasses.asdict(row)
    data["changes"] = [None if change is None else change_to_json(change) for change in row.changes]
    return data


def _metric_row_from_json(row: dict[str, Any], where: str = "", path: str = "metrics[0]") -> MetricRow:
    def get(key: str, kind: type | tuple[type, ...] = object) -> Any:
        return _field(row, key, where, path, kind)

    changes = [
        None if change is None else change_from_json(change, where, f"{path}.changes[{i}]")
        for i, change in enumerate(row.get("changes", []) if isinstance(row, dict) else [])
    ]
    return MetricRow(
        key=get("key", str),
        label=get("label", str),
        unit=get("unit", str),
        better=get("better"),
        values=list(get("values", list)),
        ratios=list(get("ratios", list)),
        changes=changes,
        intervals=list(row.get("intervals", [])),
    )
