import copy
import pickle

import pytest
import torch
from torch.profiler import ProfilerAction

from lightning_perf.collect.profiling.schedule import ProfileSchedule

GRID = [
    dict(skip_first=0, wait=0, warmup=1, active=1, repeat=0),
    dict(skip_first=5, wait=1, warmup=1, active=3, repeat=1),
    dict(skip_first=2, wait=1, warmup=1, active=2, repeat=2),
    dict(skip_first=0, wait=3, warmup=2, active=4, repeat=3),
    dict(skip_first=7, wait=0, warmup=1, active=1, repeat=0),
    dict(skip_first=1, wait=2, warmup=1, active=5, repeat=0),
]


@pytest.mark.parametrize("args", GRID)
def test_action_matches_torch_schedule_step_by_step(args):
    ours = ProfileSchedule(**args)
    theirs = torch.profiler.schedule(**args)
    assert [ours.action(step) for step in range(200)] == [theirs(step) for step in range(200)]


@pytest.mark.parametrize("args", GRID)
def test_next_cycle_start_is_the_first_step_that_needs_a_profiler(args):
    schedule = ProfileSchedule(**args)
    for step in range(120):
        upcoming = [s for s in range(step, 400) if schedule.action(s) is not ProfilerAction.NONE]
        expected = upcoming[0] if upcoming else None
        if schedule.repeat == 0 or expected is not None:
            assert schedule.next_cycle_start(step) == expected, step
        else:
            assert schedule.next_cycle_start(step) is None


def test_last_step_is_the_final_record_and_save():
    schedule = ProfileSchedule(skip_first=2, wait=1, warmup=1, active=2, repeat=2)
    assert schedule.last_step == 9
    assert schedule.action(9) is ProfilerAction.RECORD_AND_SAVE
    assert schedule.action(10) is ProfilerAction.NONE
    assert ProfileSchedule(repeat=0).last_step is None


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (dict(skip_first=-1), "skip_first"),
        (dict(wait=-2), "wait"),
        (dict(warmup=-1), "warmup"),
        (dict(active=0), "active"),
        (dict(repeat=-1), "repeat"),
        (dict(active=1.5), "active"),
        (dict(wait=True), "wait"),
    ],
)
def test_bad_numbers_name_the_argument(args, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        ProfileSchedule(**args)


def test_warmup_zero_warns_like_torch():
    with pytest.warns(UserWarning, match="warmup=0"):
        ProfileSchedule(warmup=0)


def test_pickles_and_deepcopies():
    schedule = ProfileSchedule(skip_first=3, repeat=4)
    assert pickle.loads(pickle.dumps(schedule)) == schedule
    assert copy.deepcopy(schedule) == schedule
