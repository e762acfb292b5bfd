"""The ``--fail-if-slower`` gate: which runs are slower than the baseline by more than the user allows."""

from __future__ import annotations

from lightning_perf.analysis.verdicts.comparison import CompareError, Comparison
from lightning_perf.analysis.verdicts.comparison_metrics import HEADLINE_KEY
from lightning_perf.analysis.verdicts.statistics import SLOWER, fixed


def regressions(comparison: Comparison, limit_pct: float) -> dict[str, float]:
    """Runs that fail a ``--fail-if-slower limit_pct`` gate: name -> percent slower than the baseline.

    A run fails when its mean step time (what a user waits for) is significantly more than ``limit_pct``
    percent above the baseline's: the whole interval of the slowdown lies above ``1 + limit_pct / 100``, so
    noise alone (an interval around 1) never fails the gate. A run without an interval (a summary with no
    per-step samples) is judged on the means alone, as :func:`gate_lines` says. Raises
    :class:`CompareError` when a run has no mean step time: a gate must not pass what it could not measure.
    """
    row = comparison.metric(HEADLINE_KEY)
    assert row is not None
    untimed = [name for name, value in zip(comparison.run_names, row.values, strict=True) if value is None]
    if untimed:
        raise CompareError(f"--fail-if-slower: no mean step time for {', '.join(untimed)}; cannot judge")
    return {
        name: pct
        for name, pct in comparison.slower_than_baseline.items()
        if pct > limit_pct
        and (
            name not in comparison.changes
            or (
                comparison.changes[name].verdict == SLOWER
                and comparison.changes[name].factor_low > 1 + limit_pct / 100
            )
        )
    }


def gate_lines(comparison: Comparison, limit_pct: float) -> list[str]:
    """One line per run slower than ``limit_pct``: whether it fails the gate and why (interval or none)."""
    failing = regressions(comparison, limit_pct)
    lines = []
    for name, pct in comparison.slower_than_baseline.items():
        if pct <= limit_pct:
            continue
        change = comparison.changes.get(name)
        where = f"{name} is {fixed(pct, 1)}% slower than {comparison.baseline} (mean step time"
        if change is None:
            why = "; no per-step samples, so significance is unknown"
        else:
            why = (
                f", {change.estimate_text()}, {change.confidence:.0%} interval {change.interval_text()}, "
                f"{change.method}"
            )
        if name in failing:
            significant = "" if change is None else ", significantly (the whole interval is above it)"
            lines.append(f"{where}{why}): more than --fail-if-slower {limit_pct:g}%{significant}")
        else:
            lines.append(
                f"{where}{why}): more than --fail-if-slower {limit_pct:g}%, but not significantly (the "
                "interval reaches below it): the gate passes, noise cannot be told from this slowdown"
            )
    return lines


# ------------------------------------------------------------------------------------ formatting helpers
