"""``lightning-perf tune``'s decision: the fastest candidate whose speed-up is significant, else keep the config.

:func:`choose` is the whole policy, pure, over one :class:`Speed` per candidate (speed-up over the baseline
with its interval, or the candidate's error). :func:`speeds_from_trial` is the one adapter from a trial's
result to those numbers: the per-round mean step time of each candidate against the baseline's of the same
round (paired by round), the geometric mean of the per-round ratios with a Student-t interval
(:func:`~lightning_perf.analysis.verdicts.statistics.compare_rounds`). Speed-up = baseline time / candidate
time, so above 1 is faster. When the variants differ in batch size a step holds a different number of samples,
so step times say nothing about the speed of training: then each round's samples a second are compared
instead (speed-up = candidate / baseline samples a second, :data:`METHOD_PER_SAMPLE`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scipy.stats import t as t_dist

from lightning_perf.analysis.verdicts.disturbance import Beyond, beyond, round_bound
from lightning_perf.analysis.verdicts.statistics import CONFIDENCE, RATE, TIME, compare_rounds
from lightning_perf.trial.proposals import SEMANTIC_LABEL, Candidate, changes_batch_size, semantic_label
from lightning_perf.trial.spec import TrialResult, VariantResult

KEEP = "keep your config"
# a speed-up whose whole interval lies within this factor of 1, either way, is no difference (issue 48's band)
NO_DIFFERENCE = 1.05
# an interval wider than this factor either way of its estimate says too little to print: the rounds it needs instead
READABLE_SPREAD = 10.0
MAX_ROUNDS_ESTIMATE = 200
METHOD = (
    "speed-up = baseline / candidate mean step time per round, paired by round; geometric mean of the per-round "
    "ratios with a Student-t interval of their logarithms"
)
METHOD_PER_SAMPLE = (
    "speed-up = candidate / baseline samples a second per round (the variants differ in batch size, so their step "
    "times are not comparable), paired by round; geometric mean of the per-round ratios with a Student-t interval "
    "of their logarithms"
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
    # judged on samples a second (the variants differ in batch size), not on the mean step time
    per_sample: bool = False
    # the speed-up of each round against what the machine's other work could explain in it
    weighed: Beyond | None = None

    @property
    def beyond_disturbance(self) -> bool:
        return self.weighed is not None and self.weighed.faster_beyond_disturbance

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
        if self.high / self.speedup > READABLE_SPREAD or self.speedup / self.low > READABLE_SPREAD:
            need = rounds_to_decide(self)
            more = f": about {need} would tell at this spread" if need else ""
            return (
                f"{self.label}: too few rounds to tell ({self.rounds}){more}; run with --repeats {need or 10}"
            )
        level = ("in samples a second, " if self.per_sample else "") + f"{self.confidence:.0%} interval"
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
            "basis": "samples_per_sec" if self.per_sample else "step_time",
            "round_speedups": list(self.weighed.ratios) if self.weighed else [],
            "round_disturbance_bounds": list(self.weighed.bounds) if self.weighed else [],
            "beyond_disturbance": self.beyond_disturbance,
        }


@dataclass(frozen=True)
class Decision:
    """``winner`` (a candidate's name) or None to keep the config; ``line`` says it with the interval."""

    winner: str | None
    line: str
    # there was something to judge: a candidate with an interval (False: no verdict was possible)
    judged: bool = True


def machine_was_busy(why: str, detail: str = "") -> Decision:
    """No verdict either way: others' work on the machine hid what the config needs (``why``)."""
    said = f"; {detail}" if detail else ""
    return Decision(
        None,
        f"not measured: the machine was busy ({why}){said}; {KEEP} and tune again on a quiet machine",
        judged=False,
    )


def choose(speeds: Sequence[Speed], disturbed: Sequence[str] = ()) -> Decision:
    """The fastest candidate whose interval lies above 1, or keep the config (and say why). ``disturbed`` names
    the rounds other work on the machine disturbed: with no candidate significantly faster they, not the
    candidates, may be why, so the answer is "not measured: the machine was busy" instead of keeping the config."""
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
    more = f" and {len(disturbed) - 1} more" if len(disturbed) > 1 else ""
    # others' work cannot explain a difference larger than it could cause in each round
    clear = [s for s in measured if s.beyond_disturbance]
    if disturbed and clear:
        won = max(clear, key=lambda s: s.speedup or 0.0)
        assert won.weighed is not None
        return Decision(
            won.name,
            f"{won.label}: {won.speedup:.2f}x faster, {won.weighed.describe()} ({disturbed[0]}{more}; the "
            f"{won.confidence:.0%} interval over so few rounds is {won.low:.2f}-{won.high:.2f}x)",
        )
    if disturbed:
        return machine_was_busy(
            f"{disturbed[0]}{more}",
            f"no candidate is significantly faster on these rounds (best: {best.describe()})",
        )
    if _no_difference(best):
        return Decision(
            None, f"{KEEP}: no difference within {NO_DIFFERENCE - 1:.0%} either way; best: {best.describe()}"
        )
    return Decision(None, f"{KEEP}: no candidate is significantly faster; best: {best.describe()}")


def speeds_from_trial(
    result: TrialResult,
    labels: dict[str, str],
    baseline: str,
    confidence: float = CONFIDENCE,
    per_sample: bool = False,
) -> list[Speed]:
    """Each candidate's speed-up over ``baseline`` from the trial's rounds, paired by round: over the mean step
    time, or with ``per_sample`` (the variants differ in batch size) over the samples a second."""
    return speeds_of(result.variants, labels, baseline, confidence, per_sample, finished=True)


def undecided(speeds: Sequence[Speed]) -> str | None:
    """Why another round could still change the verdict, or None when it is decided: the best candidate's
    interval lies above 1, every candidate's below, or the best's within 5% of no change either way."""
    measured = [s for s in speeds if s.error is None and s.low is not None and s.high is not None]
    if not measured:
        return "no interval yet" if any(s.error is None for s in speeds) else None
    best = max(measured, key=lambda s: s.speedup or 0.0)
    if best.significant or all((s.high or 0.0) < 1.0 for s in measured) or _no_difference(best):
        return None
    return f"{best.label}: interval {best.low:.2f}-{best.high:.2f}x still spans 1"


def _no_difference(speed: Speed) -> bool:
    """The interval lies within the no-difference band (5% either way)."""
    return (
        speed.low is not None
        and speed.high is not None
        and speed.low >= 1.0 / NO_DIFFERENCE
        and speed.high <= NO_DIFFERENCE
    )


def rounds_to_decide(speed: Speed) -> int | None:
    """Rounds the interval would need, at the spread it shows, to exclude 1 (or to fit the no-difference band
    when the estimate is within it); None without an interval. A Student-t interval of the log ratios narrows
    as t(n-1)/sqrt(n)."""
    if speed.speedup is None or speed.low is None or speed.high is None or speed.rounds < 2:
        return None
    half = (math.log(speed.high) - math.log(speed.low)) / 2.0
    if half <= 0:
        return speed.rounds
    sd = half * math.sqrt(speed.rounds) / float(t_dist.ppf(0.5 + speed.confidence / 2.0, speed.rounds - 1))
    target = abs(math.log(speed.speedup))
    target = target if target > math.log(NO_DIFFERENCE) else math.log(NO_DIFFERENCE)
    for n in range(speed.rounds, MAX_ROUNDS_ESTIMATE + 1):
        if float(t_dist.ppf(0.5 + speed.confidence / 2.0, n - 1)) * sd / math.sqrt(n) < target:
            return n
    return None


def speeds_of(
    variants: Sequence[VariantResult],
    labels: dict[str, str],
    baseline: str,
    confidence: float = CONFIDENCE,
    per_sample: bool = False,
    finished: bool = False,
) -> list[Speed]:
    """:func:`speeds_from_trial` over a list of variants; mid-trial (not ``finished``) a variant that has not
    failed is judged on the rounds it has so far."""
    by_name = {v.name: v for v in variants}
    base = by_name.get(baseline)
    values = _round_rates if per_sample else _round_means
    speeds = []
    for name, label in labels.items():
        run = by_name.get(name)
        if run is None:
            continue
        if run.status == "failed" or (finished and not run.ok):
            speeds.append(
                Speed(
                    name,
                    label,
                    error=run.error or "did not run",
                    rounds=len(run.rounds),
                    per_sample=per_sample,
                )
            )
            continue
        usable = base is not None and (base.ok or not finished)  # a finished trial's baseline must have run
        paired = [
            (i, b, r)
            for i, (b, r) in enumerate(zip(values(base) if usable else [], values(run), strict=False))
            if b and r
        ]
        pairs = [(b, r) for _, b, r in paired]
        # each round's speed-up against what the others' work could have done to it (analysis.verdicts.disturbance)
        weighed = beyond(
            [r / b if per_sample else b / r for _, b, r in paired],
            [round_bound(_others_share(base, i), _others_share(run, i)) for i, _, _ in paired],
        )
        change = (
            compare_rounds(
                [b for b, _ in pairs], [r for _, r in pairs], confidence, kind=RATE if per_sample else TIME
            )
            if len(pairs) >= 2
            else None
        )
        if change is None:
            speeds.append(Speed(name, label, rounds=len(pairs), per_sample=per_sample))
        elif per_sample:  # ratio is candidate / baseline rate: the speed-up itself
            speeds.append(
                Speed(
                    name,
                    label,
                    change.ratio,
                    change.low,
                    change.high,
                    confidence,
                    None,
                    len(pairs),
                    True,
                    weighed,
                )
            )
        else:  # ratio is candidate / baseline time: its inverse is the speed-up, the bounds swap
            speeds.append(
                Speed(
                    name,
                    label,
                    1.0 / change.ratio,
                    1.0 / change.high,
                    1.0 / change.low,
                    confidence,
                    rounds=len(pairs),
                    weighed=weighed,
                )
            )
    return speeds


def _others_share(variant: VariantResult | None, index: int) -> float | None:
    """The share of the machine's cores other processes used during the variant's round ``index`` (0-1)."""
    if variant is None or index >= len(variant.rounds):
        return None
    machine = variant.rounds[index].machine
    if machine is None or machine.other_cores is None or not machine.cpu_count:
        return None
    return machine.other_cores / machine.cpu_count


def judge_batch_sizes(
    result: TrialResult, candidates: Sequence[Candidate], baseline: str, allow_semantic: bool
) -> tuple[bool, set[str], list[str]]:
    """Whether to judge on samples a second (the variants ran with different batch sizes, or a candidate sets
    it), the candidates barred from the choice and notes saying so. A candidate found to change the batch size
    by a key of another name is labelled a semantic change and, without ``allow_semantic``, barred."""
    sizes = batch_sizes(result)
    base = sizes.get(baseline)
    changed = {name for name, size in sizes.items() if base is not None and size != base}
    sets_it = any(c.semantic and any(changes_batch_size(k) for k in c.changes) for c in candidates)
    if not changed and not sets_it:
        return False, set(), []
    shown = ", ".join(f"{name} {size}" for name, size in sizes.items())
    notes = [
        f"the variants differ in batch size ({shown}): a step holds a different number of samples, so they "
        "are judged on samples a second, not step time"
    ]
    barred = set()
    for c in candidates:
        if c.name in changed and not c.semantic:
            c.semantic, c.label = True, semantic_label(c.label)
            if not allow_semantic:
                barred.add(c.name)
                notes.append(
                    f"{c.name} changed the batch size ({base} -> {sizes[c.name]}): {SEMANTIC_LABEL}, not "
                    "chosen without --allow-semantic-changes"
                )
    return True, barred, notes


def batch_sizes(result: TrialResult) -> dict[str, int]:
    """The batch size each variant that ran was measured with (from its first round's settings), where known."""
    sizes = {}
    for variant in result.variants:
        first = variant.rounds[0] if variant.rounds else None
        if first is not None and first.settings.batch_size is not None:
            sizes[variant.name] = first.settings.batch_size
    return sizes


def _round_means(variant: VariantResult | None) -> list[float | None]:
    if variant is None or variant.status == "failed":
        return []
    return [r.timing.step_time_ms.mean if r.timing.step_time_ms is not None else None for r in variant.rounds]


def _round_rates(variant: VariantResult | None) -> list[float | None]:
    """Each round's samples a second over its timed steps (warm-up left out): the samples a step of the round
    (its whole run's, the warm-up's alike) over the mean step time; the run's own figure where the samples are
    unknown."""
    if variant is None or variant.status == "failed":
        return []
    rates: list[float | None] = []
    for r in variant.rounds:
        timing, step = r.timing, r.timing.step_time_ms
        per_step = (
            timing.samples / timing.steps
            if timing.samples > 0 and timing.steps > 0
            else r.settings.batch_size
        )
        if per_step and step is not None and step.mean > 0:
            rates.append(per_step * 1000.0 / step.mean)
        else:
            rates.append(timing.samples_per_sec)
    return rates
