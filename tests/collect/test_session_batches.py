"""PerfSession on hand-fed batches: the batch size and input shapes it reads on the per-batch path, and the window
count the callback checks after every batch."""

import pytest
import torch

from lightning_perf.collect.run_state import PerfSession
from lightning_perf.collect.steps import fetch_timing
from lightning_perf.collect.steps.step_clock import SAMPLES_PER_SEC, STEP_TIME_MS, StepClock


class ListFetcher:
    """Yields the given batches the way Lightning's fetcher does: ``(batch, batch_idx, dataloader_idx)``."""

    def __init__(self, batches) -> None:
        self.batches = iter(batches)

    def __next__(self):
        return next(self.batches), 0, 0


def fed_session(batches, batch_size=None):
    session = PerfSession("fit", StepClock(), None, batch_size)
    fetcher = ListFetcher(batches)
    assert fetch_timing.instrument(fetcher, session)
    for _ in batches:
        next(fetcher)
    session.clock.interrupt(session._boundary + 1.0)
    return session


def test_every_batch_is_counted_with_its_own_size_however_it_is_nested():
    pairs = [[torch.zeros(8, 3), torch.zeros(8)] for _ in range(9)] + [[torch.zeros(5, 3), torch.zeros(5)]]
    nested = [{"inputs": {"x": torch.zeros(4, 2)}} for _ in range(3)]
    session = fed_session(pairs)
    assert session.clock.summary().samples == 9 * 8 + 5  # the smaller last batch counts as 5, not 8
    assert session.batch_size_seen == 8
    assert session.input_shapes_vary is False  # batches 1 and 9 were looked at: one shape
    assert fed_session(nested).clock.summary().samples == 3 * 4


def test_the_batch_size_argument_wins_and_a_batch_without_tensors_has_no_size():
    session = fed_session([[torch.zeros(8, 3)] for _ in range(4)], batch_size=6)
    assert session.clock.summary().samples == 4 * 6
    assert session.batch_size_seen is None  # the size comes from the argument, not the batches
    without = fed_session([["text", 1] for _ in range(4)])
    assert without.batch_size_seen is None
    assert without.clock.summary().samples_per_sec is None


def test_window_count_follows_closed_steps_and_resets_with_the_window():
    clock = StepClock()
    for t in range(5):
        clock.batch(float(t), float(t), t + 0.5, 2)
    assert clock.window_steps == 4  # the fifth step is still open
    clock.exclude(0.25)  # the callback's own work in the open step
    clock.interrupt(5.0)
    assert clock.window_steps == 5
    window = clock.take_window()
    assert window[STEP_TIME_MS] == pytest.approx((4 * 1000.0 + 750.0) / 5)
    assert window[SAMPLES_PER_SEC] == pytest.approx(10 / 4.75)
    assert clock.window_steps == 0
