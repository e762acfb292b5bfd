"""What reading the fetch's CPU time costs per batch, measured in one process.

``PerfSession`` (``lightning_perf/collect/run_state.py``) reads the training thread's CPU time
(``time.thread_time()``) before and after every 8th DataLoader fetch, so that the summary can tell a late batch
whose loading ran in the training thread (CPU time ~ wall time) from one that waited on workers or I/O. This
script times that sampling on its own: a real ``PerfSession("fit", StepClock(), None)`` is driven through
``before_fetch(t)`` / ``after_fetch(t0, t1, fetched)`` the way the timed fetcher drives it (two
``perf_counter()`` reads a batch, a Lightning-shaped ``(batch, batch_idx, 0)`` with an ``(inputs, targets)``
batch of ``randn(4, 8)``, ``randn(4, 1)``), ``--calls`` batches a round, on two sides:

* A: the module as is, sampling on;
* B: sampling off, by setting ``run_state._FETCH_CPU_PHASE`` to 99, which the masked step (0-7) never equals
  (restored after each round of B).

The sides run interleaved, A B A B ..., the first of each pair alternating, each on a fresh session; each round
is timed in process CPU time (``time.process_time()``: the time other processes hold the core is left out). The
sampling's cost per batch is the median of the per-round differences A - B, with a 95% interval (Student t
over the rounds, ``scipy.stats.ttest_1samp``, as ``bench_overhead.py`` does). The two masked tests themselves
(``step & 7 == 4``, ``batches & 7 == 5``) run on both sides, so they are not in the difference; they are timed
apart with ``timeit`` and printed with it.

    python benchmarks/bench_fetch_cpu.py [--calls 200000] [--rounds 31]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import timeit

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from lightning_perf.collect import run_state  # noqa: E402
from lightning_perf.collect.run_state import PerfSession  # noqa: E402
from lightning_perf.collect.steps.step_clock import StepClock  # noqa: E402

# idle cost target above an empty Callback (issue 16): 2 us a batch, the whole callback included
TARGET_US = 2.0
# the callback's last recorded cost above an empty Callback(), us a batch, with its 95% interval: from
# benchmarks/README.md, section "The callback's own cost per batch, in microseconds", the paragraph "After this
# round's additions (...; 2026-12-04, load average 2.2 ...)": 1.50 us (1.43-1.56 us), measured before the fetch's
# CPU time was sampled
CALLBACK_US = 1.50
CALLBACK_INTERVAL_US = (1.43, 1.56)
# a phase the masked step (0..7) never equals: sampling off
_PHASE_OFF = 99


def run_side(calls: int, fetched: tuple, sampling: bool) -> tuple[float, float, PerfSession]:
    """``calls`` batches through a fresh session; (CPU us a batch, wall us a batch, the session)."""
    session = PerfSession("fit", StepClock(), None)
    before, after, clock = session.before_fetch, session.after_fetch, time.perf_counter
    phase = run_state._FETCH_CPU_PHASE
    if not sampling:
        run_state._FETCH_CPU_PHASE = _PHASE_OFF
    try:
        cpu0, wall0 = time.process_time(), clock()
        for _ in range(calls):
            t = clock()
            before(t)
            after(t, clock(), fetched)
        cpu1, wall1 = time.process_time(), clock()
    finally:
        run_state._FETCH_CPU_PHASE = phase
    return (cpu1 - cpu0) / calls * 1e6, (wall1 - wall0) / calls * 1e6, session


def masked_tests_us(number: int = 2_000_000) -> float:
    """The two tests that run on every batch on both sides (not in the difference), us a batch: the best of 5."""
    env = {
        "M": run_state._FETCH_CPU_MASK,
        "P": run_state._FETCH_CPU_PHASE,
        "s": type("S", (), {"batches": 13})(),
        "step": 12,
    }
    tests = min(timeit.repeat("step & M == P; s.batches & M == P + 1", globals=env, number=number, repeat=5))
    empty = min(timeit.repeat("pass", globals=env, number=number, repeat=5))
    return (tests - empty) / number * 1e6


def main() -> None:
    from scipy.stats import ttest_1samp

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=200_000, help="batches per side per round")
    parser.add_argument("--rounds", type=int, default=31)
    args = parser.parse_args()
    torch.set_num_threads(1)
    batch = (torch.randn(4, 8), torch.randn(4, 1))
    fetched = (batch, 0, 0)  # what Lightning's fetchers return: (batch, batch_idx, dataloader_idx)

    run_side(args.calls // 10, fetched, True)  # warm-up, not counted
    run_side(args.calls // 10, fetched, False)
    cpu: dict[bool, list[float]] = {True: [], False: []}
    wall: dict[bool, list[float]] = {True: [], False: []}
    sampled: dict[bool, int] = {True: 0, False: 0}
    for round_index in range(args.rounds):
        order = (True, False) if round_index % 2 == 0 else (False, True)
        for sampling in order:
            cpu_us, wall_us, session = run_side(args.calls, fetched, sampling)
            cpu[sampling].append(cpu_us)
            wall[sampling].append(wall_us)
            sampled[sampling] += session.fetches_sampled
    # the sides did what they claim: A sampled every 8th batch, B none
    assert sampled[False] == 0, sampled
    assert sampled[True] >= args.rounds * (args.calls // 8 - 1), sampled

    diffs = [a - b for a, b in zip(cpu[True], cpu[False], strict=True)]
    wall_diffs = [a - b for a, b in zip(wall[True], wall[False], strict=True)]
    interval = ttest_1samp(diffs, 0.0).confidence_interval(0.95)
    wall_interval = ttest_1samp(wall_diffs, 0.0).confidence_interval(0.95)
    cost, a_us, b_us = statistics.median(diffs), statistics.median(cpu[True]), statistics.median(cpu[False])
    tests_us = masked_tests_us()
    print(
        f"PerfSession.before_fetch + after_fetch, {args.calls} batches x {args.rounds} interleaved rounds a side, "
        f"process CPU time"
    )
    print(f"  A: sampling on (every 8th fetch)         {a_us:7.3f} us/batch (median)")
    print(f"  B: sampling off (_FETCH_CPU_PHASE = {_PHASE_OFF})  {b_us:7.3f} us/batch (median)")
    print(f"  A / B: {a_us / b_us:.4f}x")
    print(
        f"  sampling's cost A - B: {cost:.3f} us/batch (median of per-round differences; mean "
        f"{statistics.fmean(diffs):.3f}, 95% interval {interval.low:.3f}-{interval.high:.3f} us)"
    )
    print(
        f"  the same in wall time: {statistics.median(wall_diffs):.3f} us/batch (mean "
        f"{statistics.fmean(wall_diffs):.3f}, 95% interval "
        f"{wall_interval.low:.3f}-{wall_interval.high:.3f} us)"
    )
    print(
        f"  the two masked tests, on both sides so not in A - B: {tests_us:.3f} us/batch (timeit, best of 5)"
    )
    worst = CALLBACK_INTERVAL_US[1] + max(interval.high, 0.0) + tests_us
    print(
        f"budget: callback {CALLBACK_US:.2f} us (95% interval {CALLBACK_INTERVAL_US[0]:.2f}-"
        f"{CALLBACK_INTERVAL_US[1]:.2f}, last recorded in benchmarks/README.md) + sampling {cost:.3f} + tests "
        f"{tests_us:.3f} = {CALLBACK_US + cost + tests_us:.2f} us/batch; upper ends together {worst:.2f} us "
        f"(target <= {TARGET_US:g} us: {'met' if worst <= TARGET_US else 'not met'})"
    )


if __name__ == "__main__":
    main()
