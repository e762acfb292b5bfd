"""Long runs: past the exact bound, StepClock folds its arrays into quantile sketches; memory stays flat."""

from array import array

import numpy as np
import pytest
from ddsketch import DDSketch
from ddsketch.mapping import LogarithmicMapping

from lightning_perf.analysis.summary import MAX_SAMPLES, RunSummary, TimingSummary
from lightning_perf.collect.steps import step_clock
from lightning_perf.collect.steps.step_clock import STEP_TIME_MS, StepClock
from lightning_perf.collect.steps.step_history import SKETCH_RELATIVE_ACCURACY, StepQuantiles

BOUND = 1_000  # small bound: the same code path as 250,000 steps, in a fraction of a second
WINDOW = 100


def feed(clock, steps_ms, waits_ms, samples=8):
    """Drive the clock with known step and wait times, taking a window every WINDOW steps."""
    t = 0.0
    clock.epoch_started()
    clock.batch(t, t, t + 0.001, samples)  # the epoch's first fetch: start-up, not a step
    t += 0.002
    windows = []
    for i, (step, wait) in enumerate(zip(steps_ms, waits_ms, strict=True)):
        clock.batch(t, t, t + wait / 1e3, samples)
        t += step / 1e3
        if (i + 1) % WINDOW == 0:
            windows.append(clock.take_window())
    clock.interrupt(t)
    windows.append(clock.take_window())
    return windows


def series(n, seed=0):
    rng = np.random.default_rng(seed)
    steps = rng.lognormal(np.log(20.0), 0.3, n)  # a skewed step time around 20 ms
    waits = steps * rng.uniform(0.1, 0.5, n)
    return steps, waits


def close_to(sketched, exact):
    # the sketch's guarantee: within SKETCH_RELATIVE_ACCURACY of a value of the right rank (2x for an edge case)
    return abs(sketched - exact) <= 2 * SKETCH_RELATIVE_ACCURACY * abs(exact) + 1e-9


def test_a_run_past_the_bound_keeps_exact_means_and_sketched_quantiles(monkeypatch):
    monkeypatch.setattr(step_clock, "EXACT_STEPS", BOUND)
    steps, waits = series(5 * BOUND + 37)
    long_clock = StepClock()
    long_windows = feed(long_clock, steps, waits)
    monkeypatch.setattr(step_clock, "EXACT_STEPS", 10**9)
    exact_clock = StepClock()
    exact_windows = feed(exact_clock, steps, waits)

    assert len(long_clock._step_ms) <= BOUND + WINDOW  # folded: memory bounded by the bound plus a window
    assert [w[STEP_TIME_MS] for w in long_windows] == pytest.approx([w[STEP_TIME_MS] for w in exact_windows])
    long, exact = long_clock.summary(), exact_clock.summary()
    assert long.sketch_relative_accuracy == SKETCH_RELATIVE_ACCURACY
    assert exact.sketch_relative_accuracy is None
    assert long.steps == exact.steps == len(steps)
    assert long.samples == exact.samples == 8 * len(steps)
    for field in ("samples_per_sec", "batches_per_sec", "data_wait_pct"):
        assert getattr(long, field) == pytest.approx(getattr(exact, field), rel=1e-9)
    for name in ("step_time_ms", "data_wait_ms", "compute_ms"):
        got, want = getattr(long, name), getattr(exact, name)
        assert got.count == want.count
        assert got.mean == pytest.approx(want.mean, rel=1e-9)
        assert (got.min, got.max) == pytest.approx((want.min, want.max))
        for q in ("median", "p10", "p90", "median_low", "median_high"):
            assert close_to(getattr(got, q), getattr(want, q)), (name, q, getattr(got, q), getattr(want, q))
    # the kept samples stay evenly spread over the whole run, not just its end
    assert MAX_SAMPLES // 2 <= len(long.step_samples_ms) <= MAX_SAMPLES
    stride = len(steps) / len(long.step_samples_ms)
    assert long.step_samples_ms[0] == pytest.approx(steps[0], abs=1e-3)
    assert long.step_samples_ms[-1] == pytest.approx(
        steps[int((len(long.step_samples_ms) - 1) * round(stride))], abs=1e-3
    )


def test_the_kept_samples_are_every_kth_step_of_the_run(monkeypatch):
    monkeypatch.setattr(step_clock, "EXACT_STEPS", BOUND)
    n = 9 * BOUND + 11
    steps = np.arange(1, n + 1, dtype=float)  # step i lasts i ms: a sample's value is its index + 1
    clock = StepClock()
    feed(clock, steps, steps * 0.25)
    kept = clock.summary().step_samples_ms
    gaps = {round(b - a) for a, b in zip(kept, kept[1:], strict=False)}
    assert kept[0] == pytest.approx(1.0, abs=1e-3)
    assert len(gaps) == 1  # one stride over the whole run
    assert len(kept) * gaps.pop() >= n - WINDOW  # reaching the end of the run


def test_a_short_run_is_summarised_exactly_as_before():
    steps, waits = series(500)
    clock = StepClock()
    feed(clock, steps, waits)
    summary = clock.summary()
    assert summary.sketch_relative_accuracy is None
    assert summary.step_time_ms.median == pytest.approx(float(np.median(steps)), rel=1e-6)


def test_bulk_keys_match_the_sketch_one_value_at_a_time():
    values = np.random.default_rng(3).lognormal(0.0, 3.0, 200_000)  # 1e-4 .. 1e4 ms
    mapping = LogarithmicMapping(SKETCH_RELATIVE_ACCURACY)
    bulk = np.ceil(np.log(values) / np.log(mapping.gamma)).astype(np.int64)
    one_by_one = np.array([mapping.key(v) for v in values])
    assert np.mean(bulk == one_by_one) > 0.9999  # at most a rounding error at a bucket's edge
    assert np.max(np.abs(bulk - one_by_one)) <= 1

    folded, reference = StepQuantiles(), DDSketch(SKETCH_RELATIVE_ACCURACY)
    folded.add_many(values)
    for v in values:
        reference.add(v)
    for q in (0.01, 0.1, 0.5, 0.9, 0.99):
        exact = float(np.quantile(values, q, method="lower"))
        assert close_to(folded.sketch.get_quantile_value(q), exact)
        assert folded.sketch.get_quantile_value(q) == pytest.approx(
            reference.get_quantile_value(q), rel=0.011
        )


def test_zero_compute_steps_fold_without_error():
    folded = StepQuantiles()
    folded.add_many(np.array([0.0, 0.0, 0.0, 5.0, 7.0]))  # a wait that took the whole step: zero compute
    dist = folded.distribution(array("d"))
    assert (dist.count, dist.min, dist.max, dist.mean) == (5, 0.0, 7.0, pytest.approx(2.4))
    assert dist.median == 0.0
    assert close_to(dist.p90, 5.0)  # rank 0.9 * (5 - 1) = 3.6: the 4th value, as numpy's "lower" method


def test_the_sketch_accuracy_survives_the_summary_file(monkeypatch):
    monkeypatch.setattr(step_clock, "EXACT_STEPS", BOUND)
    steps, waits = series(3 * BOUND)
    clock = StepClock()
    feed(clock, steps, waits)
    timing = clock.summary()
    summary = RunSummary(timing=timing)
    again = RunSummary.from_dict(summary.to_dict())
    assert isinstance(again.timing, TimingSummary)
    assert again.timing.sketch_relative_accuracy == SKETCH_RELATIVE_ACCURACY
