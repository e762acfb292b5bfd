"""Before/after comparison of runs: settings that differ, each metric per run with its change and interval.

Pure: takes :class:`~lightning_perf.analysis.summary.RunSummary` objects and returns plain data (a
:class:`Comparison`); :mod:`lightning_perf.analysis.verdicts.comparison_render` renders it as text, markdown or a
JSON-ready dict. The headline is the MEAN step time (what a user waits for: steps x the mean step); the median
and p90 are shown as descriptive figures. Each tested metric's change carries its own interval and verdict
("faster"/"slower" or "higher"/"lower" only when significant, else "no measurable difference"), from
:mod:`lightning_perf.analysis.verdicts.metric_changes`: from the per-step samples of single runs (batch means),
or from the per-round values when runs were repeated in interleaved rounds (``rounds``). Imports nothing from
Lightning, TensorBoard or matplotlib; ``lightning_perf.cli.compare`` does the files, the chart and TensorBoard.

Example::

    runs = [RunSummary.load("logs/baseline"), RunSummary.load("logs/workers4")]
    c = compare(runs, ["baseline", "workers4"])
    print(c.verdict)  # workers4 is 1.67x faster than baseline (mean step time, 95% interval 1.60x-1.74x); ...
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lightning_perf.analysis.numbers import finite as _finite
from lightning_perf.analysis.rules.noise import GPU_SLOWED_TITLE, noisy_machine
from lightning_perf.analysis.summary import RunSummary
from lightning_perf.analysis.verdicts.comparison_metrics import (
    ENVIRONMENT_KEYS,
    HEADLINE_KEY,
    METRICS,
    VERDICT_DETAIL_KEYS,
    MetricSpec,
    check_summary,
    headline_metrics,
    settings_diffs,
)
from lightning_perf.analysis.verdicts.hparams_diff import hparams_diffs
from lightning_perf.analysis.verdicts.metric_changes import metric_change
from lightning_perf.analysis.verdicts.statistics import (
    CONFIDENCE,
    NO_DIFFERENCE,
    MetricChange,
    fixed,
    log_ratio,
)
from lightning_perf.errors import ConfigError, LightningPerfError

JSON_SCHEMA_NAME = "lightning-perf/comparison"
JSON_SCHEMA_VERSION = 3

NA = "n/a"

# Units whose change reads as speed ("faster"/"slower") rather than "higher"/"lower".
SPEED_UNITS = ("ms", "s", "samples/s")
# Decimals shown per unit: 0.1 ms and 0.1 percentage point are below run-to-run noise of these figures;
# memory in GB needs two decimals to show a change of tens of MB.
UNIT_DECIMALS = {"ms": 1, "s": 2, "%": 1, "samples/s": 1, "GB": 2}
DEFAULT_DECIMALS = 2
RATIO_DECIMALS = 2
# The log of the largest float: a ratio whose log is beyond this (either way) overflows, or its inverse does.
_LOG_FLOAT_MAX = math.log(sys.float_info.max)


__all__ = [
    "ENVIRONMENT_KEYS",
    "METRICS",
    "CompareError",
    "Comparison",
    "MetricChange",
    "MetricRow",
    "check_summary",
    "compare",
    "headline_metrics",
]


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
    # per run: the change against the baseline with its interval (None: the baseline, or not testable)
    changes: list[MetricChange | None] = field(default_factory=list)
    # per run: its own 95% interval of the value [low, high] (None where the summary has none)
    intervals: list[list[float] | None] = field(default_factory=list)


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
    # run name -> percent by which its mean step time exceeds the baseline's (slower runs only)
    slower_than_baseline: dict[str, float]
    # one line each: environment differences, partial or unfinished runs, busy machines
    warnings: list[str] = field(default_factory=list)
    # non-baseline run name -> change of its mean step time against the baseline (where testable)
    changes: dict[str, MetricChange] = field(default_factory=dict)
    # how the verdict's interval was found ("" when no run could be tested)
    method: str = ""
    # interleaved rounds per run behind the figures (1: single runs)
    rounds: int = 1
    # the runs are known to differ (trial variants), also where the settings fingerprint sees no difference
    variants_differ: bool = False
    # the user's hyperparameters (hparams.yaml) whose values differ: key -> value per run (verdicts.hparams_diff)
    hparams_diff: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def same_settings(self) -> bool:
        """No setting differs, as far as the fingerprint and the caller know: differences are the machine's."""
        return not self.settings_diff and not self.variants_differ and not self.hparams_diff

    @property
    def baseline_index(self) -> int:
        return self.run_names.index(self.baseline)

    def metric(self, key: str) -> MetricRow | None:
        return next((row for row in self.metrics if row.key == key), None)


def compare(
    summaries: Sequence[RunSummary],
    names: Sequence[str],
    baseline: int = 0,
    rounds: Sequence[Sequence[RunSummary]] | None = None,
    confidence: float = CONFIDENCE,
    variants_differ: bool = False,
    hparams: Sequence[Mapping[str, Any] | None] | None = None,
) -> Comparison:
    """Compare runs against a baseline: each metric's change with its interval and a verdict.

    Args:
        summaries: the runs' summaries.
        names: the runs' names, one each, unique, in the order of ``summaries``.
        baseline: the index of the run the others are compared with.
        rounds: each run's repeats (same order as ``summaries``, paired by index: round ``i`` of every run ran
            in the same interleaved round); metrics are then judged over the per-round values (each round's mean
            step time for the headline). Without it they are judged from each run's per-step samples (batch
            means of the mean step time).
        confidence: the confidence level of the intervals (0.95 by default).
        variants_differ: the caller knows the runs differ (e.g. trial variants with different code), so equal
            settings fingerprints do not mean "same settings".
        hparams: each run's saved hyperparameters (or None), for the ones that differ (``hparams_diff``).

    Returns:
        The comparison: ``changes`` (one :class:`MetricChange` a metric and run), the settings that differ, and
        the headline.

    Raises:
        ConfigError: fewer than two runs, names that are not unique or do not match the summaries, a baseline
            out of range, or ``rounds`` of another length.
    """
    if len(summaries) != len(names):
        raise ConfigError(f"compare: {len(summaries)} summaries but {len(names)} names")
    if len(summaries) < 2:
        raise ConfigError(f"compare: needs at least two runs, got {len(summaries)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"compare: run names must be unique, got {list(names)}")
    if not 0 <= baseline < len(summaries):
        raise ConfigError(f"compare: baseline index {baseline} is out of range for {len(summaries)} runs")
    if rounds is not None and len(rounds) != len(summaries):
        raise ConfigError(
            f"compare: rounds holds {len(rounds)} runs but there are {len(summaries)} summaries"
        )
    names = list(names)
    settings_diff, environment_diff = settings_diffs(summaries)
    metrics = [_metric_row(spec, summaries, baseline, rounds, confidence) for spec in METRICS]
    metrics = [
        row
        for row, spec in zip(metrics, METRICS, strict=True)
        if not spec.only_where_present or any(v is not None for v in row.values)
    ]
    slower = _slower_than_baseline(metrics, names, baseline)
    _refuse_beyond_floats(metrics, names, baseline, slower)
    comparison = Comparison(
        run_names=names,
        baseline=names[baseline],
        settings_diff=settings_diff,
        environment_diff=environment_diff,
        metrics=metrics,
        verdict="",
        slower_than_baseline=slower,
        rounds=min((len(r) for r in rounds), default=1) if rounds else 1,
        variants_differ=variants_differ,
        hparams_diff=hparams_diffs(hparams or []),
    )
    headline = comparison.metric(HEADLINE_KEY)
    assert headline is not None  # always computed (never only_where_present)
    comparison.changes = {
        name: change
        for name, change in zip(names, headline.changes, strict=True)
        if change is not None and name != names[baseline]
    }
    comparison.verdict = _verdict(comparison)
    comparison.warnings = _warnings(comparison, summaries)
    return comparison


def _metric_row(
    spec: MetricSpec,
    summaries: Sequence[RunSummary],
    baseline: int,
    rounds: Sequence[Sequence[RunSummary]] | None,
    confidence: float,
) -> MetricRow:
    values = [_finite(spec.get(s)) for s in summaries]
    base = values[baseline]
    ratios = [v / base if v is not None and base else None for v in values]
    changes: list[MetricChange | None] = [None] * len(summaries)
    for i in range(len(summaries)):
        if i != baseline:
            changes[i] = metric_change(spec, summaries, rounds, baseline, i, confidence)
    intervals: list[list[float] | None] = []
    for summary in summaries:
        low, high = spec.get_interval(summary) if spec.get_interval is not None else (None, None)
        low, high = _finite(low), _finite(high)
        intervals.append([low, high] if low is not None and high is not None else None)
    return MetricRow(spec.key, spec.label, spec.unit, spec.better, values, ratios, changes, intervals)


def _refuse_beyond_floats(
    metrics: list[MetricRow], names: list[str], baseline: int, slower: dict[str, float]
) -> None:
    """:class:`CompareError` naming the run and the figure whose change against the baseline is beyond the
    range of a float (a corrupt summary: step times of 1e308 ms): no verdict, table or JSON could hold it."""
    for row in metrics:
        base = row.values[baseline]
        for i, name in enumerate(names):
            if i == baseline:
                continue
            value, change = row.values[i], row.changes[i]
            numbers = [row.ratios[i], slower.get(name) if row.key == HEADLINE_KEY else None]
            if change is not None:
                numbers += [change.ratio, change.low, change.high]
                numbers += [change.factor, change.factor_low, change.factor_high]
            beyond = any(x is not None and not math.isfinite(x) for x in numbers)
            if value is not None and base is not None and value > 0 and base > 0:
                beyond = beyond or abs(log_ratio(value, base)) >= _LOG_FLOAT_MAX  # x or 1/x overflows
            if beyond:
                raise CompareError(
                    f"{name}: {row.label} {format_value(value, row.unit)} against "
                    f"{format_value(base, row.unit)} in {names[baseline]} (the baseline): a change beyond "
                    f"what a float holds, so no comparison can show it; is {name}'s summary corrupt?"
                )


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
        return f"no verdict: baseline {c.baseline} has no mean step time"
    times = {i: v for i, v in enumerate(row.values) if i != base_i and v is not None and v > 0}
    if not times:
        return "no verdict: no run besides the baseline has a mean step time"
    best = min(times, key=times.__getitem__)
    best_time = times[best]
    name = c.run_names[best]
    change = row.changes[best]
    c.method = change.method if change is not None else ""
    if change is None:
        head = _point_verdict(name, c.baseline, base_time, best_time)
    elif not change.significant:
        head = f"no measurable difference between {name} and {c.baseline} ({_ratio_text(change)})"
        if c.same_settings:
            head = f"same settings: differences are noise ({name} vs {c.baseline}: {_ratio_text(change)})"
        elif change.rounds_needed is not None:
            head += f"; about {change.rounds_needed} rounds would tell a change of this size"
        elif c.rounds > 1:
            head += "; more rounds could tell only a larger change"
    else:
        head = f"{name} is {change.describe(c.baseline, 'mean step time')}"
        if c.same_settings:
            head = f"same settings, yet {head}: the machine changed between the runs, not the settings"
    if len(times) > 1:
        differing = _largest_measured_difference(row.changes, times)
        if change is not None and change.verdict == NO_DIFFERENCE and differing is not None:
            # the fastest is within noise but another run measurably differs: the headline names that run
            best, slow = differing
            head = (
                f"no run is measurably faster than {c.baseline}; the largest measured difference: "
                f"{c.run_names[best]} is {slow.describe(c.baseline, 'mean step time')}"
            )
        elif change is not None and change.verdict == NO_DIFFERENCE:
            head = f"no run is measurably faster than {c.baseline}: {head}"
        elif best_time < base_time:
            head = f"fastest of {len(times) + 1} runs: {head}"
        else:
            head = f"no run is faster than {c.baseline}; the fastest: {head}"
    details = []
    for key in VERDICT_DETAIL_KEYS:
        detail = c.metric(key)
        if detail is not None and detail.values[base_i] is not None and detail.values[best] is not None:
            details.append(arrow_text(detail.label, detail.values[base_i], detail.values[best], detail.unit))
    return "; ".join([head, *details])


def _largest_measured_difference(
    changes: Sequence[MetricChange | None], times: Mapping[int, float]
) -> tuple[int, MetricChange] | None:
    """The run (index, change) whose mean step time differs most from the baseline's, among the measured
    (significant) changes; None when no run's change is measured."""
    measured = [
        (i, change)
        for i, change in enumerate(changes)
        if i in times and change is not None and change.significant
    ]
    if not measured:
        return None
    return max(measured, key=lambda found: abs(math.log(found[1].ratio)))


def _point_verdict(name: str, baseline: str, base_time: float, best_time: float) -> str:
    """The verdict from the means alone (summaries without per-step samples: no interval to judge by)."""
    factor = factor_text(base_time, best_time)
    if factor == factor_text(1.0, 1.0):
        change = "about as fast as"
    else:
        change = f"{factor} {'faster' if best_time < base_time else 'slower'} than"
    return f"{name} is {change} {baseline} (mean step time; no interval: no per-step samples)"


def _ratio_text(change: MetricChange) -> str:
    """``mean step time: estimate 1.03x faster, 95% interval 0.97x-1.10x`` (one direction throughout)."""
    low, high = change.factor_low, change.factor_high
    return (
        f"mean step time: estimate {change.estimate_text(RATIO_DECIMALS)}, {change.confidence:.0%} interval "
        f"{fixed(low, RATIO_DECIMALS)}x-{fixed(high, RATIO_DECIMALS)}x"
    )


def _warnings(c: Comparison, summaries: Sequence[RunSummary]) -> list[str]:
    lines = []
    if c.environment_diff:
        parts = [
            f"{key}: {' / '.join(plain_text(v) for v in values)}"
            for key, values in c.environment_diff.items()
        ]
        lines.append(
            f"warning: runs come from different environments ({'; '.join(parts)}); "
            "differences may come from the environment, not the settings"
        )
    untested = [name for i, name in enumerate(c.run_names) if i != c.baseline_index and name not in c.changes]
    if untested and c.metric(HEADLINE_KEY) is not None:
        lines.append(
            f"note: no interval for {', '.join(untested)}: too few per-step samples (summaries written before "
            "version 0.3 keep none), so the verdict rests on the means alone"
        )
    for name, s in zip(c.run_names, summaries, strict=True):
        noisy = noisy_machine(s, None)
        if noisy is not None:
            # the GPU's clocks alone, or others on the machine (busy, or holding the cores the run needed)
            where = (
                "with its GPU's clocks held down" if noisy.title == GPU_SLOWED_TITLE else "on a busy machine"
            )
            lines.append(f"warning: {name} was measured {where}: {noisy.evidence}")
        if s.timing.steps == 0:
            lines.append(f"warning: {name} is a partial summary: no training steps were timed")
        elif s.status != "finished":
            lines.append(
                f"warning: {name} has status {s.status!r}: its figures may cover only part of the run"
            )
    return lines


def format_value(value: float | None, unit: str) -> str:
    """``100.0 ms``, ``45.0%``; ``n/a`` for an absent value (never 0)."""
    if value is None:
        return NA
    decimals = UNIT_DECIMALS.get(unit, DEFAULT_DECIMALS)
    if unit == "%":
        return f"{fixed(value, decimals)}%"
    return f"{fixed(value, decimals)} {unit}".rstrip()


def factor_text(before: float, after: float) -> str:
    factor = max(before, after) / min(before, after)
    return f"{fixed(factor, RATIO_DECIMALS)}x"


def arrow_text(label: str, before: float | None, after: float | None, unit: str) -> str:
    return f"{label} {format_value(before, unit)} -> {format_value(after, unit)}"


def plain_text(value: Any) -> str:
    return NA if value is None else str(value)
