"""Uncertainty of timings and of the change between runs: intervals and verdicts that hold under noise.

The verdicts compare MEAN step times (:mod:`~lightning_perf.analysis.verdicts.mean_intervals` gives single runs
their batch-means interval); :class:`MetricChange` holds any metric's change, read one way through its
``direction``/``factor``/``factor_low``/``factor_high``.

Pure (SciPy and NumPy, no Lightning, no torch). Three questions, each answered with a named method:

* How sure is one run's median? :func:`median_interval`: the distribution-free confidence interval of the
  median from order statistics (``scipy.stats.binom``), no assumption on the shape of the step times.
* Did one run's median or p90 change against another's? :func:`compare_samples`: bootstrap interval of the
  ratio over the per-step samples (``scipy.stats.bootstrap``), confirmed by a Mann-Whitney U test
  (``scipy.stats.mannwhitneyu``). Steps within one run share the machine's state, so this covers that run's
  noise only, not a change of the machine between runs: the verdict says "single run".
* Did a variant change over repeated, interleaved rounds? :func:`compare_rounds`: the per-round ratios
  (variant / baseline of the same round, each round's mean step time for the headline) are the replicates; their geometric mean with a Student-t interval
  on the log ratios (``scipy.stats.t``), which stays valid with as few as two rounds where a bootstrap or an
  order-statistic interval cannot reach 95%. It also says how many rounds a verdict would need.

SciPy is imported inside the functions: ``import lightning_perf`` stays light.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lightning_perf.errors import ConfigError

CONFIDENCE = 0.95
# Bootstrap resamples: 2000 keeps the Monte-Carlo error of a 95% percentile bound near 0.5% of its width
# (Efron & Tibshirani, "An Introduction to the Bootstrap", ch. 19: 1000-2000 for percentile intervals).
BOOTSTRAP_RESAMPLES = 2000
# A fixed seed: the same runs give the same interval every time they are compared.
BOOTSTRAP_SEED = 0
# Fewer samples per run than this give no per-step test (an interval from a handful of steps misleads).
MIN_SAMPLES = 8
# The largest number of rounds the "rounds needed" estimate names; beyond it the answer is "many more".
MAX_ROUNDS_ESTIMATE = 50

FASTER = "faster"
SLOWER = "slower"
NO_DIFFERENCE = "no measurable difference"
VERDICTS = (FASTER, SLOWER, NO_DIFFERENCE)


# kinds of change (MetricChange.kind): what ``ratio``/``low``/``high`` hold and which words the verdict uses
TIME = "time"  # run / baseline of a time (below 1: less time, faster); verdict faster / slower
RATE = "rate"  # run / baseline of a rate such as samples/s (above 1: faster); verdict faster / slower
RATIO = "ratio"  # run / baseline of any other quantity; verdict higher / lower
POINTS = "points"  # run - baseline of a share, in percentage points; verdict higher / lower
HIGHER = "higher"
LOWER = "lower"


@dataclass(frozen=True)
class MetricChange:
    """The change of one metric between a run and the baseline, with its interval and verdict.

    ``kind`` says what the three numbers are: for ``"time"`` (the default) ``ratio`` is run / baseline (below
    1: the run takes less time) and ``low``/``high`` bound it at ``confidence``; ``"rate"`` and ``"ratio"``
    are run / baseline too; ``"points"`` holds the difference run - baseline in percentage points. ``verdict``
    is ``"faster"``/``"slower"`` (time, rate), ``"higher"``/``"lower"`` (ratio, points), or ``"no measurable
    difference"`` when the interval holds no change. ``method`` names how the interval was found;
    ``rounds_needed``, for repeated trials without a verdict, estimates how many rounds would tell.

    Read it in one direction with :attr:`direction`, :attr:`factor`, :attr:`factor_low`, :attr:`factor_high`:
    a time that halves is ``direction == "faster"``, ``factor == 2.0``, its interval e.g. 1.8-2.2.
    """

    ratio: float
    low: float
    high: float
    confidence: float
    verdict: str
    method: str
    rounds_needed: int | None = None
    kind: str = TIME

    @property
    def significant(self) -> bool:
        return self.verdict != NO_DIFFERENCE

    @property
    def direction(self) -> str:
        """Which way the estimate points: "faster"/"slower" (time, rate) or "higher"/"lower", also without a
        verdict (then the interval reaches the other way too)."""
        if self.kind == TIME:
            return FASTER if self.ratio <= 1.0 else SLOWER
        if self.kind == RATE:
            return FASTER if self.ratio >= 1.0 else SLOWER
        up = self.ratio > 0.0 if self.kind == POINTS else self.ratio >= 1.0
        return HIGHER if up else LOWER

    def _directed(self) -> tuple[float, float, float]:
        if self.kind == POINTS:
            return self.ratio, self.low, self.high
        falling = (self.kind, self.direction) in ((TIME, FASTER), (RATE, SLOWER), (RATIO, LOWER))
        if falling:  # the factor by which the value falls: the inverse ratio, its bounds swapped
            return _inverse(self.ratio), _inverse(self.high), _inverse(self.low)
        return self.ratio, self.low, self.high

    @property
    def factor(self) -> float:
        """The change in its :attr:`direction`: ``1.40`` for 1.40x faster (1/ratio of times), points for shares."""
        return self._directed()[0]

    @property
    def factor_low(self) -> float:
        """The low end of :attr:`factor`'s interval, in the same direction (below 1 when not significant)."""
        return self._directed()[1]

    @property
    def factor_high(self) -> float:
        return self._directed()[2]

    def interval_text(self, decimals: int = 2) -> str:
        """``1.32-1.49x`` (the interval in the factor's direction) or ``-3.0 to +0.4 pts``."""
        if self.kind == POINTS:
            return f"{fixed(self.low, 1, '+')} to {fixed(self.high, 1, '+')} pts"
        return f"{fixed(self.factor_low, decimals)}-{fixed(self.factor_high, decimals)}x"

    def estimate_text(self, decimals: int = 2) -> str:
        """``1.40x faster`` or ``-1.4 pts``: the estimate in its direction."""
        if self.kind == POINTS:
            return f"{fixed(self.ratio, 1, '+')} pts"
        return f"{fixed(self.factor, decimals)}x {self.direction}"

    def describe(self, than: str = "", metric: str = "") -> str:
        """``1.25x slower than a (mean step time, 95% interval 1.10x-1.41x)``, or ``no measurable difference
        from a (mean step time: estimate 1.03x faster, 95% interval 0.97x-1.10x)``: one direction throughout."""
        level = f"{self.confidence:.0%}"
        if self.kind == POINTS:
            bounds = self.interval_text()
        else:
            bounds = f"{fixed(self.factor_low, 2)}x-{fixed(self.factor_high, 2)}x"
        if not self.significant:
            whom = f" from {than}" if than else ""
            about = f"{metric}: " if metric else ""
            return (
                f"{NO_DIFFERENCE}{whom} ({about}estimate {self.estimate_text()}, {level} interval {bounds})"
            )
        whom = f" than {than}" if than else ""
        about = f"{metric}, " if metric else ""
        return f"{self.estimate_text()}{whom} ({about}{level} interval {bounds})"


def _inverse(value: float) -> float:
    return 1.0 / value if value > 0 else math.inf


# Beyond this a fixed-point number is mostly digits no float holds ("1e+20", not "100000000000000000000.00").
_FIXED_LIMIT = 1e15
# Values whose squares and sums stay far from the float range need no scaling (2**400 is about 2.6e120).
_SCALE_ABOVE = 2.0**400


def fixed(value: float, decimals: int, sign: str = "") -> str:
    """``value`` with ``decimals`` decimals (``sign="+"``: always signed); in scientific notation (3 digits)
    from 1e15 on, so an absurd figure from a corrupt summary reads ``1e+308``, not a line of 309 digits."""
    if math.isfinite(value) and abs(value) >= _FIXED_LIMIT:
        return f"{value:{sign}.3g}"
    return f"{value:{sign}.{decimals}f}"


def safe_exp(x: float) -> float:
    """``math.exp`` that gives ``inf`` past the float range instead of raising OverflowError."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def log_ratio(numerator: float, denominator: float) -> float:
    """``log(numerator / denominator)`` of two positive numbers, also where the quotient itself would overflow
    or vanish (1e308 / 0.5): then as a difference of logarithms. Ordinary values give the same as before."""
    quotient = numerator / denominator
    if 0.0 < quotient < math.inf:
        return math.log(quotient)
    return math.log(numerator) - math.log(denominator)


def scale_of(values: Sequence[float]) -> float:
    """A power of two to divide ``values`` by before summing or squaring them, so that no intermediate result
    overflows (a step time of 1e308 ms): 1.0 for ordinary values (their results stay bit for bit as before),
    else the power of two just below the largest magnitude (dividing by it is exact)."""
    largest = max((abs(v) for v in values), default=0.0)
    if not math.isfinite(largest) or largest < _SCALE_ABOVE:
        return 1.0
    return math.ldexp(1.0, math.frexp(largest)[1] - 1)


def mean_and_spread(values: Sequence[float]) -> tuple[float, float]:
    """(mean, sample standard deviation) of two values or more, without intermediate overflow
    (:func:`scale_of`); ``inf`` only where the result itself is beyond floats."""
    scale = scale_of(values)
    scaled = [v / scale for v in values]
    n = len(scaled)
    mean = sum(scaled) / n
    spread = math.sqrt(sum((x - mean) ** 2 for x in scaled) / (n - 1))
    return mean * scale, spread * scale


def check_confidence(confidence: float) -> None:
    if not 0.5 <= confidence < 1.0:
        raise ConfigError(f"confidence: expected a number in [0.5, 1), got {confidence!r}")


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Distribution-free interval of the median: order statistics ``X(l)``, ``X(n-l+1)``.

    ``P(X(l) <= median <= X(n-l+1)) = 1 - 2 * P(B <= l-1)`` for ``B ~ Binomial(n, 1/2)``; ``l`` is the largest
    index keeping that at or above ``confidence``. ``None`` for fewer than 6 values (no such ``l``).
    """
    ranks = median_interval_ranks(len(values), confidence)
    if ranks is None:
        return None
    ordered = sorted(values)
    return ordered[ranks[0] - 1], ordered[ranks[1] - 1]


def median_interval_ranks(n: int, confidence: float = CONFIDENCE) -> tuple[int, int] | None:
    """The 1-based ranks ``(l, n-l+1)`` of :func:`median_interval`'s order statistics; ``None`` below 6 values."""
    from scipy.stats import binom

    check_confidence(confidence)
    if n == 0:
        return None
    lower = int(binom.ppf((1.0 - confidence) / 2.0, n, 0.5))  # P(B <= lower - 1) < alpha / 2
    if lower < 1:
        return None
    return lower, n - lower + 1


def _percentile_bootstrap(
    data: tuple, statistic: Any, paired: bool, confidence: float
) -> tuple[float, float]:
    """``scipy.stats.bootstrap`` percentile interval, vectorised, with the fixed seed (same runs, same answer)."""
    import numpy as np
    from scipy.stats import bootstrap

    result = bootstrap(
        data,
        statistic,
        paired=paired,
        vectorized=True,
        confidence_level=confidence,
        n_resamples=BOOTSTRAP_RESAMPLES,
        method="percentile",
        rng=np.random.default_rng(BOOTSTRAP_SEED),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def compare_samples(
    baseline: Sequence[float],
    other: Sequence[float],
    statistic: str = "median",
    confidence: float = CONFIDENCE,
) -> MetricChange | None:
    """The change of a timing from per-step samples of two single runs (a time: lower is faster).

    ``statistic`` is ``"median"``, ``"p90"`` or ``"mean"``. A verdict needs both the bootstrap interval of the
    ratio to exclude 1 and Mann-Whitney U (two-sided) to reject "same distribution" at ``1 - confidence``:
    each alone has about that false-positive rate; together at most that. ``None`` when either run has fewer
    than :data:`MIN_SAMPLES` samples.
    """
    import numpy as np
    from scipy.stats import mannwhitneyu

    check_confidence(confidence)
    reducers = {
        "median": lambda x, axis: np.median(x, axis=axis),
        "p90": lambda x, axis: np.percentile(x, 90.0, axis=axis),
        "mean": lambda x, axis: np.mean(x, axis=axis),
    }
    if statistic not in reducers:
        raise ConfigError(f"statistic: expected one of {', '.join(reducers)}, got {statistic!r}")
    if len(baseline) < MIN_SAMPLES or len(other) < MIN_SAMPLES:
        return None
    base, run = np.asarray(baseline, dtype=float), np.asarray(other, dtype=float)
    reduce = reducers[statistic]
    base_value = float(reduce(base, -1))
    if base_value <= 0:
        return None

    def ratio(b: np.ndarray, r: np.ndarray, axis: int = -1) -> np.ndarray:
        return reduce(r, axis) / np.maximum(reduce(b, axis), 1e-12)

    low, high = _percentile_bootstrap((base, run), ratio, False, confidence)
    p_value = float(mannwhitneyu(base, run, alternative="two-sided").pvalue)
    point = float(reduce(run, -1)) / base_value
    separated = (low > 1.0 or high < 1.0) and p_value < 1.0 - confidence
    verdict = NO_DIFFERENCE if not separated else (SLOWER if point > 1.0 else FASTER)
    method = (
        f"bootstrap of the {statistic} ratio over per-step samples ({len(base)} vs {len(run)} steps) and "
        f"Mann-Whitney U (p={p_value:.2g}); single run each: changes of the machine between runs are not covered"
    )
    return MetricChange(point, low, high, confidence, verdict, method)


def verdict_word(kind: str, up: bool) -> str:
    """The word for a significant change of ``kind`` whose value went up (``up``) or down."""
    if kind == TIME:
        return SLOWER if up else FASTER
    if kind == RATE:
        return FASTER if up else SLOWER
    return HIGHER if up else LOWER


def compare_rounds(
    baseline: Sequence[float], other: Sequence[float], confidence: float = CONFIDENCE, kind: str = TIME
) -> MetricChange | None:
    """The change of a metric over interleaved rounds, paired by round (``other[i] / baseline[i]``).

    Geometric mean of the per-round ratios with a Student-t interval on their logarithms (``scipy.stats.t``).
    For the headline the per-round values are each round's mean step time. ``kind`` is ``"time"``, ``"rate"``
    or ``"ratio"`` (see :class:`MetricChange`). ``None`` with fewer than two complete rounds or a non-positive
    value.
    """
    from scipy.stats import t as student_t

    check_confidence(confidence)
    pairs = [(b, o) for b, o in zip(baseline, other, strict=True) if b and o and b > 0 and o > 0]
    n = len(pairs)
    if n < 2:
        return None
    logs = [log_ratio(o, b) for b, o in pairs]  # o / b itself may overflow (1e308 / 0.5)
    mean = sum(logs) / n
    spread = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    half = float(student_t.ppf(0.5 + confidence / 2.0, n - 1)) * spread / math.sqrt(n)
    low, high = safe_exp(mean - half), safe_exp(mean + half)
    separated = low > 1.0 or high < 1.0
    verdict = NO_DIFFERENCE if not separated else verdict_word(kind, mean > 0)
    needed = None if separated else rounds_needed(mean, spread, confidence)
    method = f"paired t-interval of the log per-round ratios ({n} interleaved rounds, geometric mean)"
    return MetricChange(safe_exp(mean), low, high, confidence, verdict, method, needed, kind)


def compare_round_differences(
    baseline: Sequence[float], other: Sequence[float], confidence: float = CONFIDENCE
) -> MetricChange | None:
    """The change of a share (percent) over interleaved rounds: paired t-interval of the per-round differences
    ``other[i] - baseline[i]`` in percentage points (``kind="points"``). ``None`` with fewer than two rounds."""
    from scipy.stats import t as student_t

    check_confidence(confidence)
    diffs = [o - b for b, o in zip(baseline, other, strict=True)]
    n = len(diffs)
    if n < 2:
        return None
    mean, spread = mean_and_spread(diffs)
    half = float(student_t.ppf(0.5 + confidence / 2.0, n - 1)) * spread / math.sqrt(n)
    low, high = mean - half, mean + half
    separated = low > 0.0 or high < 0.0
    verdict = NO_DIFFERENCE if not separated else verdict_word(POINTS, mean > 0)
    method = f"paired t-interval of the per-round differences ({n} interleaved rounds)"
    return MetricChange(mean, low, high, confidence, verdict, method, None, POINTS)


def rounds_needed(mean_log: float, spread_log: float, confidence: float = CONFIDENCE) -> int | None:
    """Rounds at which a change of ``exp(mean_log)`` with this round-to-round spread would be told apart.

    ``None`` when the observed change is nil (no count would tell) or more than :data:`MAX_ROUNDS_ESTIMATE`
    would be needed.
    """
    from scipy.stats import t as student_t

    if spread_log <= 0.0:
        return 2
    if abs(mean_log) < 1e-12:
        return None
    for n in range(2, MAX_ROUNDS_ESTIMATE + 1):
        if float(student_t.ppf(0.5 + confidence / 2.0, n - 1)) * spread_log / math.sqrt(n) < abs(mean_log):
            return n
    return None
