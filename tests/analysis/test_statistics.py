"""Verdicts under noise: intervals and tests on synthetic per-step samples and rounds, many seeds each."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_perf.analysis.summary import Distribution, RunSummary, Settings, TimingSummary
from lightning_perf.analysis.verdicts.comparison import compare
from lightning_perf.analysis.verdicts.comparison_render import (
    from_json,
    render_markdown,
    render_text,
    to_json,
)
from lightning_perf.analysis.verdicts.mean_intervals import share_interval
from lightning_perf.analysis.verdicts.regression_gate import gate_lines, regressions
from lightning_perf.analysis.verdicts.statistics import (
    FASTER,
    NO_DIFFERENCE,
    SLOWER,
    compare_rounds,
    compare_samples,
    median_interval,
)

SEEDS = 200


def steps(seed: int, n: int = 300, scale: float = 1.0) -> list[float]:
    """Per-step times in ms: log-normal around 10 ms with a long right tail, as real step times have."""
    rng = np.random.default_rng(seed)
    return list(10.0 * scale * rng.lognormal(0.0, 0.25, n))


def run(samples: list[float], **settings: object) -> RunSummary:
    return RunSummary(
        timing=TimingSummary(
            steps=len(samples), step_time_ms=Distribution.of(samples), step_samples_ms=list(samples)
        ),
        settings=Settings(**settings),
    )


def test_identical_distributions_give_no_difference_at_the_stated_rate():
    false_positives = sum(
        compare_samples(steps(2 * seed), steps(2 * seed + 1)).significant for seed in range(SEEDS)
    )
    # stated rate 5%; with 200 seeds, 8% is beyond three binomial standard deviations above it
    assert false_positives / SEEDS <= 0.08


def test_a_ten_percent_shift_with_enough_steps_is_found():
    found = [compare_samples(steps(seed, 1000), steps(seed + 500, 1000, scale=1.1)) for seed in range(20)]
    assert all(change.verdict == SLOWER for change in found)
    assert all(change.low > 1.0 and change.ratio == pytest.approx(1.1, rel=0.05) for change in found)
    faster = compare_samples(steps(1, 1000, scale=1.1), steps(2, 1000))
    assert faster.verdict == FASTER and faster.high < 1.0
    assert "bootstrap" in faster.method and "Mann-Whitney" in faster.method


def test_gate_on_noise_alone_never_fails_in_100_seeded_tries():
    for seed in range(100):
        comparison = compare([run(steps(2 * seed)), run(steps(2 * seed + 1))], ["a", "b"])
        assert regressions(comparison, 5.0) == {}, comparison.verdict


def test_gate_fails_a_significant_slowdown_and_passes_a_large_noisy_one(capsys):
    slow = compare([run(steps(1, 1000)), run(steps(2, 1000, scale=1.2))], ["a", "b"])
    assert set(regressions(slow, 5.0)) == {"b"}
    assert "significantly (the whole interval is above it)" in gate_lines(slow, 5.0)[0]
    # 8 steps each with a 30x spread: a 20% slower median is not told from noise
    rng = np.random.default_rng(3)
    wild_a, wild_b = list(rng.lognormal(0, 1.5, 8) * 10), list(rng.lognormal(0, 1.5, 8) * 12)
    noisy = compare([run(wild_a), run(wild_b)], ["a", "b"])
    if noisy.slower_than_baseline.get("b", 0) > 5:
        assert regressions(noisy, 5.0) == {}
        assert "but not significantly" in gate_lines(noisy, 5.0)[0]


def test_same_settings_say_noise_unless_significant():
    same = compare([run(steps(1)), run(steps(2))], ["a", "b"])
    assert same.verdict.startswith("same settings: differences are noise")
    assert same.changes["b"].verdict == NO_DIFFERENCE
    changed = compare([run(steps(1, 1000)), run(steps(2, 1000, scale=1.3))], ["a", "b"])
    assert changed.verdict.startswith("same settings, yet b is 1.3")
    assert "the machine changed" in changed.verdict
    differing = compare([run(steps(1, 1000), num_workers=0), run(steps(2, 1000, 0.5), num_workers=2)], "ab")
    assert differing.verdict.startswith("b is 1.98x faster than a (mean step time, 95% interval 1.9")
    text = render_text(differing)
    assert "method: batch means" in text and "how to read" in text
    assert "1.98x faster, 1.9" in text  # the change's cell holds its interval, in the same direction
    assert "batch means" in render_markdown(differing)
    assert from_json(to_json(differing)) == differing


def test_rounds_are_judged_paired_and_say_how_many_more_are_needed():
    clear = compare_rounds([10.0, 10.4, 9.8], [12.0, 12.3, 11.9])
    assert clear.verdict == SLOWER and clear.low > 1.0 and "3 interleaved rounds" in clear.method
    unclear = compare_rounds([10.0, 10.4, 9.8], [10.9, 10.2, 10.6])
    assert unclear.verdict == NO_DIFFERENCE and unclear.rounds_needed is not None
    assert unclear.rounds_needed > 3
    assert compare_rounds([10.0], [11.0]) is None
    rounds = [[run(steps(s)) for s in (1, 2, 3)], [run(steps(s, scale=0.5)) for s in (4, 5, 6)]]
    comparison = compare([r[0] for r in rounds], ["a", "b"], rounds=rounds)
    assert comparison.rounds == 3 and comparison.changes["b"].verdict == FASTER
    assert "paired t-interval" in comparison.method


def test_median_and_share_intervals():
    values = steps(7, 400)
    low, high = median_interval(values)
    assert low < float(np.median(values)) < high
    assert median_interval(values[:5]) is None  # no 95% order-statistic interval below 6 values
    covered = sum(
        median_interval(steps(seed, 60))[0] <= 10.0 <= median_interval(steps(seed, 60))[1]
        for seed in range(200)
    )
    assert covered / 200 >= 0.90  # stated 95%: the true median of the lognormal is 10 ms
    waits = [0.2 * v for v in values]
    share = share_interval(waits, values)
    assert share is not None and share == pytest.approx((20.0, 20.0))  # every step waits 20%: no spread
    with pytest.raises(ValueError, match="confidence"):
        median_interval(values, confidence=1.5)


def test_trial_variants_with_equal_fingerprints_are_not_called_same_settings():
    """Variants that differ in code (e.g. batched transforms) have equal settings fingerprints: the verdict
    must not call their difference noise just because the fingerprint sees none."""
    from lightning_perf.analysis.summary import Distribution, RunSummary, TimingSummary
    from lightning_perf.analysis.verdicts.comparison import compare
    from lightning_perf.analysis.verdicts.comparison_render import from_json, render_text, to_json

    def run(median: float) -> RunSummary:
        step = Distribution(50, median, median, median * 1.1, median * 0.9, median * 1.2)
        return RunSummary(timing=TimingSummary(steps=50, step_time_ms=step))

    rounds = [[run(200.0), run(201.0), run(199.0)], [run(150.0), run(152.0), run(149.0)]]
    same = compare([r[0] for r in rounds], ["before", "after"], rounds=rounds)
    known = compare([r[0] for r in rounds], ["before", "after"], rounds=rounds, variants_differ=True)
    assert same.same_settings and "same settings" in same.verdict
    assert not known.same_settings and "same settings" not in known.verdict
    assert "does not record" in render_text(known) and "no settings differ" in render_text(same)
    assert from_json(to_json(known)).variants_differ
