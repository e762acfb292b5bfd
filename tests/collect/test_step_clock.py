"""StepClock on hand-made timestamps: the arithmetic of wait, step, compute, windows and gaps."""

import pytest

from lightning_perf.collect.steps.step_clock import (
    BATCHES_PER_SEC,
    COMPUTE_MS,
    DATA_WAIT_MS,
    DATA_WAIT_PCT,
    SAMPLES_PER_SEC,
    STEP_TIME_MS,
    StepClock,
)


def run_steps(clock, start, steps, wait_s, compute_s, samples=4):
    """Feed ``steps`` batches of known wait and compute; returns the time after the last fetch start."""
    t = start
    for _ in range(steps):
        clock.batch(t, t, t + wait_s, samples)
        t += wait_s + compute_s
    return t


def test_steady_state_wait_step_compute_and_throughput():
    clock = StepClock()
    clock.epoch_started()
    t = run_steps(clock, 0.0, 1, 0.5, 0.010)  # the epoch's first fetch (worker start-up) is kept apart
    t = run_steps(clock, t, 10, 0.004, 0.006)
    clock.interrupt(t)  # closes the tenth step
    window = clock.take_window()
    assert window[STEP_TIME_MS] == pytest.approx(10.0)
    assert window[DATA_WAIT_MS] == pytest.approx(4.0)
    assert window[COMPUTE_MS] == pytest.approx(6.0)
    assert window[DATA_WAIT_PCT] == pytest.approx(40.0)
    assert window[SAMPLES_PER_SEC] == pytest.approx(400.0)
    assert window[BATCHES_PER_SEC] == pytest.approx(100.0)
    summary = clock.summary()
    assert summary.steps == 10
    assert summary.epoch_start_ms.count == 1
    assert summary.epoch_start_ms.mean == pytest.approx(500.0)
    assert summary.data_wait_ms.median == pytest.approx(4.0)
    assert summary.samples == 40


def test_windows_reset_and_run_totals_keep_everything():
    clock = StepClock()
    t = run_steps(clock, 0.0, 5, 0.001, 0.009)
    clock.interrupt(t)
    first = clock.take_window()
    t = run_steps(clock, t, 5, 0.009, 0.001)
    clock.interrupt(t)
    second = clock.take_window()
    assert first[DATA_WAIT_PCT] == pytest.approx(10.0)
    assert second[DATA_WAIT_PCT] == pytest.approx(90.0)
    assert clock.take_window() == {}
    summary = clock.summary()
    assert summary.steps == 10
    assert summary.data_wait_pct == pytest.approx(50.0)
    assert summary.step_time_ms.median == pytest.approx(10.0)


def test_interruptions_are_charged_to_their_kind_not_to_a_step():
    clock = StepClock()
    clock.batch(0.0, 0.0, 0.002, 4)
    clock.interrupt(0.010, "validation")  # the step ends where validation begins
    clock.settle(1.010)  # one second of validation
    clock.batch(1.020, 1.020, 1.022, 4)
    clock.interrupt(1.030, "checkpoint")
    clock.batch(1.530, 1.530, 1.531, 4)  # half a second of checkpointing, ended by the next fetch
    summary = clock.summary()
    assert summary.steps == 2
    assert summary.step_time_ms.max == pytest.approx(10.0)
    assert summary.validation_s == pytest.approx(1.0)
    assert summary.checkpoint_s == pytest.approx(0.5)


def test_excluded_time_leaves_the_step():
    clock = StepClock()
    clock.batch(0.0, 0.0, 0.001, 2)
    clock.exclude(0.003)  # e.g. the callback logging a window inside this step
    clock.interrupt(0.010)
    assert clock.take_window()[STEP_TIME_MS] == pytest.approx(7.0)


def test_iterator_creation_joins_the_epoch_start():
    clock = StepClock()
    clock.epoch_started()
    clock.iterator_created(0.2)
    clock.batch(1.0, 1.0, 1.05, 4)
    assert clock.summary().epoch_start_ms.mean == pytest.approx(250.0)
    assert clock.steps == 0


def test_unknown_batch_size_drops_samples_per_second_only():
    clock = StepClock()
    t = run_steps(clock, 0.0, 3, 0.001, 0.001, samples=None)
    clock.interrupt(t)
    window = clock.take_window()
    assert SAMPLES_PER_SEC not in window
    assert window[BATCHES_PER_SEC] == pytest.approx(500.0)
    assert clock.summary().samples_per_sec is None


def test_unmeasurable_wait_is_absent_not_zero():
    clock = StepClock(measure_data_wait=False)
    t = run_steps(clock, 0.0, 3, 0.0, 0.002)
    clock.interrupt(t)
    window = clock.take_window()
    assert DATA_WAIT_MS not in window and DATA_WAIT_PCT not in window and COMPUTE_MS not in window
    summary = clock.summary()
    assert summary.data_wait_ms is None and summary.data_wait_pct is None
    assert summary.step_time_ms.count == 3


def test_empty_clock_reports_absent_figures():
    summary = StepClock().summary()
    assert summary.steps == 0
    assert summary.step_time_ms is None and summary.data_wait_pct is None and summary.samples_per_sec is None


def test_the_callbacks_own_work_at_the_boundary_belongs_to_no_step():
    clock = StepClock()
    clock.batch(0.0, 0.0, 0.001, 4)
    # the boundary of the next batch is at 10 ms; the profiler work there ends at 13 ms
    clock.batch(0.010, 0.013, 0.014, 4)
    clock.interrupt(0.023)
    summary = clock.summary()
    assert summary.step_time_ms.count == 2
    assert summary.step_time_ms.min == pytest.approx(10.0)
    assert summary.step_time_ms.max == pytest.approx(10.0)


def test_a_stopped_fetch_closes_the_open_step_and_starts_none():
    clock = StepClock()
    clock.batch(0.0, 0.0, 0.002, 4)
    clock.fetch_stopped(0.010)
    clock.interrupt(0.5)
    assert clock.summary().steps == 1
    assert clock.summary().step_time_ms.max == pytest.approx(10.0)
