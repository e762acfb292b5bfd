"""``lightning-perf tune``'s decision: the fastest candidate whose speed-up is significant, else keep the config.

:func:`choose` is the whole policy, pure, over one :class:`Speed` per candidate (speed-up over the baseline
with its interval, or the candidate's error). :func:`speeds_from_trial` is the one adapter from a trial's
result to those numbers: the per-round mean step time of each candidate against the baseline's of the same
round (paired by round), the geometric mean of the per-round ratios with a Student-t interval
(:func:`~lightning_perf.analysis.verdicts.statistics.compare_rounds`). Speed-up = baseline time / candidate
time, so above 1 is faster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lightning_perf.analysis.verdicts.statistics import CONFIDENCE, compare_rounds
from lightning_perf.trial.spec import TrialResult, VariantResult

KEEP = "keep your config"
METHOD = (
    "speed-up = baseline / candidate mean step time per round, paired by round; geometric mean of the per-round "
    "ratios with a Student-t interval of their logarithms"
)


@dataclass(frozen=True)
class Speed:
    """A candidate's measured speed-up over the baseline (``low``-``high`` at ``confidence``), or its error."""

    name: str
    label: str
    speedup: float | None = None
    low: float | None = None
    high: float | None = None
    confidence: float = CONFIDENCE
    error: str | None = None
    rounds: int = 0

    @property
    def significant(self) -> bool:
        return self.low is not None and self.low > 1.0

    def describe(self) -> str:
        """``num_workers=2: 1.62x faster (95% interval 1.51-1.74x)``, or the error, or why there is no figure."""
        if self.error is not None:
            return f"{self.label}: failed: {self.error}"
        if self.speedup is None:
            return f"{self.label}: no interval ({self.rounds} complete round(s); at least 2 are needed)"
        if self.low is None or self.high is None:
            return f"{self.label}: {self.speedup:.2f}x"
        level = f"{self.confidence:.0%} interval"
        if self.significant:
            return f"{self.label}: {self.speedup:.2f}x faster ({level} {self.low:.2f}-{self.high:.2f}x)"
        # one direction, as every verdict reads: a slowdown with its interval as slowdowns
        slowdown = f"{1.0 / self.speedup:.2f}x slower ({level} {1.0 / self.high:.2f}-{1.0 / self.low:.2f}x)"
        if self.high < 1.0:
            return f"{self.label}: {slowdown}"
        estimate = (
            f"{self.speedup:.2f}x faster, {level} {self.low:.2f}-{self.high:.2f}x"
            if self.speedup >= 1.0
            else slowdown.replace(" (", ", ").rstrip(")")
        )
        return f"{self.label}: no measurable difference (estimate {estimate})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "label": self.label,
            "speedup": self.speedup,
            "low": self.low,
            "high": self.high,
            "confidence": self.confidence,
            "significant": self.significant,
            "rounds": self.rounds,
            "error": self.error,
        }


@dataclass(frozen=True)
class Decision:
    """``winner`` (a candidate's name) or None to keep the config; ``line`` says it with the interval."""

    winner: str | None
    line: str
    # there was something to judge: a candidate with an interval (False: no verdict was possible)
    judged: bool = True


def choose(speeds: Sequence[Speed]) -> Decision:
    """The fastest candidate whose interval lies above 1, or keep the config (and say why)."""
    significant = [s for s in speeds if s.significant and s.speedup is not None]
    if significant:
        best = max(significant, key=lambda s: s.speedup or 0.0)
        return Decision(best.name, best.describe())
    measured = [s for s in speeds if s.error is None and s.low is not None and s.speedup is not None]
    if not measured:
        why = (
            "every candidate failed"
            if speeds and all(s.error for s in speeds)
            else "no candidate has an interval"
        )
        return Decision(None, f"no verdict: {why}; {KEEP}", judged=False)
    best = max(measured, key=lambda s: s.speedup or 0.0)
    return Decision(None, f"{KEEP}: no candidate is significantly faster; best: {best.describe()}")


def speeds_from_trial(
    result: TrialResult, labels: dict[str, str], baseline: str, confidence: float = CONFIDENCE
) -> list[Speed]:
    """Each candidate's speed-up over ``baseline`` from the trial's rounds (mean step time, paired by round)."""
    by_name = {v.name: v for v in result.variants}
    base = by_name.get(baseline)
    speeds = []
    for name, label in labels.items():
        run = by_name.get(name)
        if run is None:
            continue
        if not run.ok:
            speeds.append(Speed(name, label, error=run.error or "did not run", rounds=len(run.rounds)))
            continue
        base_means, run_means = _round_means(base), _round_means(run)
        pairs = [(b, r) for b, r in zip(base_means, run_means, strict=False) if b and r]
        change = (
            compare_rounds([b for b, _ in pairs], [r for _, r in pairs], confidence)
            if len(pairs) >= 2
            else None
        )
        if change is None:
            speeds.append(Speed(name, label, rounds=len(pairs)))
            continue
        # ratio is candidate / baseline time: its inverse is the speed-up, the bounds swap
        speeds.append(
            Speed(
                name,
                label,
                1.0 / change.ratio,
                1.0 / change.high,
                1.0 / change.low,
                confidence,
                rounds=len(pairs),
            )
        )
    return speeds


def _round_means(variant: VariantResult | None) -> list[float | None]:
    if variant is None or not variant.ok:
        return []
    return [r.timing.step_time_ms.mean if r.timing.step_time_ms is not None else None for r in variant.rounds]
