"""The step anatomy's stand-in profiler keeps its stack whatever the user's code does with start() and stop():
each ``with`` closes its own entry, a start left open ends with the ``with`` around it, and the self times still
add up (issue 54). The real HookProfiler over Lightning's real profilers, without a fit."""

from __future__ import annotations

import time

from lightning.pytorch.profilers import PassThroughProfiler, SimpleProfiler

from lightning_perf.collect.steps.hook_profiler import MAX_OPEN_STARTS, HookProfiler


def a_batch(hooks: HookProfiler) -> dict[str, float]:
    """The seconds per name of the one batch run since the last call."""
    hooks.next_batch()
    seconds, batches = hooks.take_window()
    assert batches == 1
    return seconds


def test_a_start_stopped_inside_a_later_with_leaves_each_with_its_own_time():
    hooks = HookProfiler(SimpleProfiler(), {})
    hooks.next_batch()  # what ran before the first batch is no step's
    with hooks.profile("outer"):
        hooks.start("crossing")
        with hooks.profile("inner"):
            hooks.stop("crossing")  # crosses "inner": started outside it, stopped inside
            time.sleep(0.002)
    seconds = a_batch(hooks)
    # both hooks closed, by name: "inner" holds its sleep, "outer" only its own bookkeeping around it
    assert seconds["inner"] >= 0.002
    assert 0.0 <= seconds["outer"] < seconds["inner"]
    assert hooks._stack == []
    # the user's profiler got every start and stop, by the names it was given
    assert set(hooks.inner.recorded_durations) == {"outer", "inner", "crossing"}
    assert hooks.inner.current_actions == {}


def test_a_start_left_open_ends_with_the_with_around_it_and_its_inside_is_that_ones():
    hooks = HookProfiler(PassThroughProfiler(), {})
    hooks.next_batch()
    for _ in range(3):  # as a training_step that starts an action every batch and never stops it
        with hooks.profile("step"):
            hooks.start("left open")
            with hooks.profile("work"):
                time.sleep(0.001)
        assert hooks._stack == []
    seconds = a_batch(hooks)
    # "work" ran inside the left-open action, inside "step": it is not "step"'s own time
    assert seconds["work"] >= 0.003
    assert seconds["step"] < seconds["work"]
    assert "left open" not in seconds


def test_starts_with_no_with_around_them_are_bounded():
    hooks = HookProfiler(PassThroughProfiler(), {})
    for number in range(3 * MAX_OPEN_STARTS):  # another thread's starts, never stopped, each named anew
        hooks.start(f"action {number}")
    assert len(hooks._stack) == MAX_OPEN_STARTS
    with hooks.profile("hook") as bound:  # a hook still opens and closes on top of them
        assert bound == "hook"
    assert len(hooks._stack) == MAX_OPEN_STARTS
