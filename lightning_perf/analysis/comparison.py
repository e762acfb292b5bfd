"""Before/after comparison of runs: settings that differ, each metric per run with its ratio to a baseline.

Pure: takes :class:`~lightning_perf.analysis.summary.RunSummary` objects and returns plain data (a
:class:`Comparison`), rendered as text, markdown or a JSON-ready dict. Imports nothing from Lightning,
TensorBoard or matplotlib; ``lightning_perf.cli.compare`` does the files, the chart and TensorBoard.

Example::

    runs = [RunSummary.load("logs/baseline"), RunSummary.load("logs/workers4")]
    c = compare(runs, ["baseline", "workers4"])
    print(c.verdict)  # workers4 is 1.67x faster than baseline (median step time); data wait 45.0% -> 3.1%
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lightning_perf.analysis import markdown, metrics
from lightning_perf.analysis.numbers import finite as _finite
from lightning_perf.analysis.numbers import is_number, whole
from lightning_perf.analysis.summary import RunSummary, Settings, TimingSummary, UtilizationSummary
from lightning_perf.errors import LightningPerfError

JSON_SCHEMA_NAME = "lightning-perf/comparison"
JSON_SCHEMA_VERSION = 1

NA = "n/a"

# Settings that describe the machine and software rather than a choice the user made: a difference here is
# flagged as a warning (the figures may reflect the machine, not the change), not listed as a setting change.
ENVIRONMENT_KEYS = ("host", "cpu_count", "gpu_name", "torch_version", "lightning_version", "cuda_version")

# Units whose change reads as speed ("faster"/"slower") rather than "higher"/"lower".
SPEED_UNITS = ("ms", "s", "samples/s")
# Decimals shown per unit: 0.1 ms and 0.1 percentage point are below run-to-run noise of these figures;
# memory in GB needs two decimals to show a change of tens of MB.
UNIT_DECIMALS = {"ms": 1, "s": 2, "%": 1, "samples/s": 1, "GB": 2}
DEFAULT_DECIMALS = 2
RATIO_DECIMALS = 2


class CompareError(LightningPerfError):
    """Bad input for a comparison; the message names the file or argument. Exit code 2, no traceback."""


@dataclass
class MetricRow:
    """One metric across runs. ``ratios[i] = values[i] / baseline value``, None if either is absent or 0."""

    key: str
    label: str
    unit: str
    better: str | None  # "lower", "higher" or None (neutral: shown, not judged)
    values: list[float | None]
    ratios: list[float | None]


@dataclass
class Comparison:
    """The result of :func:`compare`. Per-run lists follow ``run_names`` order."""

    run_names: list[str]
    baseline: str
    # setting -> value per run, only settings whose values differ between runs
    settings_diff: dict[str, list[Any]]
    # environment key (ENVIRONMENT_KEYS) -> value per run, only where runs differ
    environment_diff: dict[str, list[Any]]
    metrics: list[MetricRow]
    verdict: str
    # run name -> percent by which its median step time exceeds the baseline's (slower runs only)
    slower_than_baseline: dict[str, float]
    # one line each: environment differences, partial or unfinished runs
    warnings: list[str] = field(default_factory=list)

    @property
    def baseline_index(self) -> int:
        return self.run_names.index(self.baseline)

    def metric(self, key: str) -> MetricRow | None:
        return next((row for row in self.metrics if row.key == key), None)


@dataclass(frozen=True)
class _MetricSpec:
    key: str
    label: str
    unit: str
    better: str | None
    get: Callable[[RunSummary], float | None]
    # hidden when no run has a value (GPU figures on CPU-only runs)
    only_where_present: bool = False


def _step_time(s: RunSummary, stat: str) -> float | None:
    dist = s.timing.step_time_ms
    return getattr(dist, stat) if dist is not None else None


def _gpu(s: RunSummary, name: str) -> float | None:
    gpu = s.utilization.gpu
    return getattr(gpu, name) if gpu is not None else None


def _cpu(s: RunSummary, name: str) -> float | None:
    cpu = s.utilization.cpu
    return getattr(cpu, name) if cpu is not None else None


# how each summary metric of the registry (lightning_perf.analysis.metrics) is read from a run summary, and
# whether it is hidden when no run has it (GPU figures)
_READERS: dict[str, tuple[Callable[[RunSummary], float | None], bool]] = {
    "step_time_median_ms": (lambda s: _step_time(s, "median"), False),
    "step_time_p90_ms": (lambda s: _step_time(s, "p90"), False),
    "data_wait_pct": (lambda s: s.timing.data_wait_pct, False),
    "samples_per_sec": (lambda s: s.timing.samples_per_sec, False),
    "gpu_util_pct": (lambda s: _gpu(s, "util_pct"), True),
    "kernel_busy_pct": (lambda s: _gpu(s, "kernel_busy_pct"), True),
    "peak_gpu_mem_gb": (lambda s: _gpu(s, "peak_mem_used_gb"), True),
    "process_cpu_pct": (lambda s: _cpu(s, "process_cpu_pct"), False),
}
METRICS: tuple[_MetricSpec, ...] = tuple(
    _MetricSpec(m.key, m.label, m.unit, m.better, *_READERS[m.key]) for m in metrics.SUMMARY_METRICS
)
HEADLINE_KEY = "step_time_median_ms"


def headline_metrics(summary: RunSummary) -> dict[str, float]:
    """The compared metrics of one run by key (absent ones left out): also what the HParams tab shows."""
    values = {spec.key: spec.get(summary) for spec in METRICS}
    return {key: float(value) for key, value in values.items() if value is not None}


# shown beside the headline in the verdict when both runs have them
VERDICT_DETAIL_KEYS = ("data_wait_pct", "gpu_util_pct")


def check_summary(summary: RunSummary) -> None:
    """Raise ``ValueError`` saying what is wrong when a summary lacks the structure :func:`compare` reads.

    A hand-edited or corrupt ``perf_summary.json`` can parse yet hold ``"timing": null`` or a string where a
    number belongs; that must be an error, not a silent "n/a".
    """
    for name, kind in (
        ("timing", TimingSummary),
        ("utilization", UtilizationSummary),
        ("settings", Settings),
    ):
        if not isinstance(getattr(summary, name), kind):
            raise ValueError(f"{name} is {getattr(summary, name)!r}, expected an object")
    steps = summary.timing.steps
    if whole(steps) is None or steps < 0:
        raise ValueError(f"timing.steps is {steps!r}, expected a whole number >= 0")
    for spec in METRICS:
        try:
            value = spec.get(summary)
        except AttributeError as err:
            raise ValueError(f"cannot read {spec.key}: {err}") from err
        if value is not None and not is_number(value):
            raise ValueError(f"{spec.key} is {value!r}, expected a number or null")


def compare(summaries: Sequence[RunSummary], names: Sequence[str], baseline: int = 0) -> Comparison:
    """Compare ``summaries`` (named ``names``, same order) against ``summaries[baseline]``."""
    if len(summaries) != len(names):
        raise ValueError(f"compare: {len(summaries)} summaries but {len(names)} names")
    if len(summaries) < 2:
        raise ValueError(f"compare: needs at least two runs, got {len(summaries)}")
    if len(set(names)) != len(names):
        raise ValueError(f"compare: run names must be unique, got {list(names)}")
    if not 0 <= baseline < len(summaries):
        raise ValueError(f"compare: baseline index {baseline} is out of range for {len(summaries)} runs")
    names = list(names)
    settings_diff, environment_diff = _settings_diffs(summaries)
    metrics = [_metric_row(spec, summaries, baseline) for spec in METRICS]
    metrics = [
        row
        for row, spec in zip(metrics, METRICS, strict=True)
        if not spec.only_where_present or any(v is not None for v in row.values)
    ]
    comparison = Comparison(
        run_names=names,
        baseline=names[baseline],
        settings_diff=settings_diff,
        environment_diff=environment_diff,
        metrics=metrics,
        verdict="",
        slower_than_baseline=_slower_than_baseline(metrics, names, baseline),
    )
    comparison.verdict = _verdict(comparison)
    comparison.warnings = _warnings(comparison, summaries)
    return comparison


def _settings_diffs(summaries: Sequence[RunSummary]) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
    settings: dict[str, list[Any]] = {}
    environment: dict[str, list[Any]] = {}
    for f in dataclasses.fields(Settings):
        values = [getattr(s.settings, f.name) for s in summaries]
        if any(v != values[0] for v in values[1:]):
            (environment if f.name in ENVIRONMENT_KEYS else settings)[f.name] = values
    return settings, environment


def _metric_row(spec: _MetricSpec, summaries: Sequence[RunSummary], baseline: int) -> MetricRow:
    values = [_finite(spec.get(s)) for s in summaries]
    base = values[baseline]
    ratios = [v / base if v is not None and base else None for v in values]
    return MetricRow(spec.key, spec.label, spec.unit, spec.better, values, ratios)


def _slower_than_baseline(metrics: list[MetricRow], names: list[str], baseline: int) -> dict[str, float]:
    row = next((r for r in metrics if r.key == HEADLINE_KEY), None)
    if row is None:
        return {}
    return {
        name: (ratio - 1.0) * 100.0
        for i, (name, ratio) in enumerate(zip(names, row.ratios, strict=True))
        if i != baseline and ratio is not None and ratio > 1.0
    }


def _verdict(c: Comparison) -> str:
    row = c.metric(HEADLINE_KEY)
    assert row is not None  # always computed (never only_where_present)
    base_i = c.baseline_index
    base_time = row.values[base_i]
    if base_time is None or base_time <= 0:
        return f"no verdict: baseline {c.baseline} has no median step time"
    times = {i: v for i, v in enumerate(row.values) if i != base_i and v is not None and v > 0}
    if not times:
        return "no verdict: no run besides the baseline has a median step time"
    best = min(times, key=times.__getitem__)
    best_time = times[best]
    factor = _factor_text(base_time, best_time)
    name = c.run_names[best]
    if factor == _factor_text(1.0, 1.0):
        change = "about as fast as"
    else:
        change = f"{factor} {'faster' if best_time < base_time else 'slower'} than"
    head = f"{name} is {change} {c.baseline} (median step time)"
    if len(times) > 1:
        if best_time < base_time:
            head = f"fastest of {len(times) + 1} runs: {head}"
        else:
            head = f"no run is faster than {c.baseline}; the fastest: {head}"
    details = []
    for key in VERDICT_DETAIL_KEYS:
        detail = c.metric(key)
        if detail is not None and detail.values[base_i] is not None and detail.values[best] is not None:
            details.append(_arrow(detail.label, detail.values[base_i], detail.values[best], detail.unit))
    return "; ".join([head, *details])


def _warnings(c: Comparison, summaries: Sequence[RunSummary]) -> list[str]:
    lines = []
    if c.environment_diff:
        parts = [
            f"{key}: {' / '.join(_plain(v) for v in values)}" for key, values in c.environment_diff.items()
        ]
        lines.append(
            f"warning: runs come from different environments ({'; '.join(parts)}); "
            "differences may come from the environment, not the settings"
        )
    for name, s in zip(c.run_names, summaries, strict=True):
        if s.timing.steps == 0:
            lines.append(f"warning: {name} is a partial summary: no training steps were timed")
        elif s.status != "finished":
            lines.append(
                f"warning: {name} has status {s.status!r}: its figures may cover only part of the run"
            )
    return lines


# ----------------------------------------------------------------------------------------------- formatting


def format_value(value: float | None, unit: str) -> str:
    """``100.0 ms``, ``45.0%``; ``n/a`` for an absent value (never 0)."""
    if value is None:
        return NA
    decimals = UNIT_DECIMALS.get(unit, DEFAULT_DECIMALS)
    if unit == "%":
        return f"{value:.{decimals}f}%"
    return f"{value:.{decimals}f} {unit}".rstrip()


def _factor_text(before: float, after: float) -> str:
    factor = max(before, after) / min(before, after)
    return f"{factor:.{RATIO_DECIMALS}f}x"


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
    factor = _factor_text(before, after)
    if factor == _factor_text(1.0, 1.0):
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


def _arrow(label: str, before: float | None, after: float | None, unit: str) -> str:
    return f"{label} {format_value(before, unit)} -> {format_value(after, unit)}"


def format_change(
    label: str, before: float | None, after: float | None, unit: str, better: str | None
) -> str:
    """``step time 100.0 ms -> 60.0 ms, 1.67x faster`` (no judgement when a value is absent)."""
    note = change_note(before, after, unit, better)
    arrow = _arrow(label, before, after, unit)
    return f"{arrow}, {note}" if note else arrow


def _plain(value: Any) -> str:
    return NA if value is None else str(value)


def _cells(c: Comparison, row: MetricRow) -> list[str]:
    base = row.values[c.baseline_index]
    cells = []
    for i, value in enumerate(row.values):
        cell = format_value(value, row.unit)
        note = "" if i == c.baseline_index else change_note(base, value, row.unit, row.better)
        cells.append(f"{cell} ({note})" if note else cell)
    return cells


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
        rows += [[f"  {key}", *(_plain(v) for v in values)] for key, values in c.settings_diff.items()]
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
    if not c.settings_diff:
        lines.append("(no settings differ between the runs)")
    lines += ["", *c.warnings, f"verdict: {c.verdict}"]
    return "\n".join(lines) + "\n"


def render_markdown(c: Comparison) -> str:
    """The same content as :func:`render_text` as GitHub/TensorBoard markdown."""
    names = [markdown.code(name) + _baseline_marker(c, name) for name in c.run_names]
    lines = [
        f"### Performance comparison ({len(c.run_names)} runs, baseline {markdown.code(c.baseline)})",
        "",
    ]
    lines += [f"> **{w}**" if w.startswith("warning") else f"> {w}" for w in c.warnings]
    if c.warnings:
        lines.append("")
    lines += [f"**Verdict:** {c.verdict}", ""]
    if c.settings_diff:
        settings = [
            [markdown.code(key), *(markdown.code(_plain(v)) for v in vals)]
            for key, vals in c.settings_diff.items()
        ]
        lines += markdown.table(["setting", *names], settings) + [""]
    else:
        lines += ["No settings differ between the runs.", ""]
    lines += markdown.table(["metric", *names], [[row.label, *_cells(c, row)] for row in c.metrics])
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
        metrics=[MetricRow(**row) for row in data["metrics"]],
        verdict=data["verdict"],
        slower_than_baseline=dict(data["slower_than_baseline"]),
        warnings=list(data["warnings"]),
    )


def regressions(comparison: Comparison, limit_pct: float) -> dict[str, float]:
    """Runs whose median step time is more than ``limit_pct`` percent above the baseline's: name -> percent.

    Raises :class:`CompareError` when a run has no median step time: a gate must not pass what it could not
    measure.
    """
    row = comparison.metric("step_time_median_ms")
    assert row is not None
    untimed = [name for name, value in zip(comparison.run_names, row.values, strict=True) if value is None]
    if untimed:
        raise CompareError(f"--fail-if-slower: no median step time for {', '.join(untimed)}; cannot judge")
    return {name: pct for name, pct in comparison.slower_than_baseline.items() if pct > limit_pct}
