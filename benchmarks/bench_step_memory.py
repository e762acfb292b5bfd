"""StepClock over ten million steps: memory flat past the exact bound, the cost per batch unchanged.

Two clocks are fed the same synthetic steps, interleaved in blocks of 100,000 in one process, a logging window
every 1,000 steps (as ``log_every_n_steps`` windows do): the shipped clock, which folds its arrays into quantile
sketches past ``EXACT_STEPS``, and the same clock with folding off (every step kept: 24 bytes a step). Printed
at each million steps: the bytes each clock holds in its step arrays and sketches, and the process's RSS; at
the end the thread CPU time per batch of each (``batch()`` plus its share of the windows and the folds) and the
ratio, and how far the folded summary's median and p90 are from the exact ones.

    python benchmarks/bench_step_memory.py [--steps 10000000]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import psutil

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from lightning_perf.collect import step_clock  # noqa: E402
from lightning_perf.collect.steps.step_clock import StepClock  # noqa: E402

BLOCK = 100_000
WINDOW = 1_000


def held_bytes(clock: StepClock) -> int:
    arrays = clock._step_ms, clock._wait_ms, clock._samples
    folded = clock._folded
    sketch_bins = sum(len(q.sketch._store.bins) for q in (folded.step, folded.wait, folded.compute))
    kept = folded.kept_step, folded.kept_wait
    return sum(a.itemsize * len(a) for a in arrays + kept) + 8 * sketch_bins


def feed_block(clock: StepClock, state: dict, steps_s: np.ndarray, waits_s: np.ndarray) -> float:
    """Feed one block of steps; returns the thread CPU seconds it took."""
    t = state["t"]
    batch, take = clock.batch, clock.take_window
    start = time.thread_time()
    for i, (step, wait) in enumerate(zip(steps_s.tolist(), waits_s.tolist(), strict=True)):
        batch(t, t, t + wait, 32)
        t += step
        if i % WINDOW == WINDOW - 1:
            take()
    spent = time.thread_time() - start
    state["t"] = t
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000_000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    bound = step_clock.EXACT_STEPS
    clocks = {"folding": StepClock(), "every step kept": StepClock()}
    states = {name: {"t": 0.0} for name in clocks}
    cpu = dict.fromkeys(clocks, 0.0)
    for clock in clocks.values():
        clock.epoch_started()
        clock.batch(0.0, 0.0, 0.0, 32)
    print(f"exact bound: {bound:,} steps; {args.steps:,} steps, a window every {WINDOW:,}")
    print(f"{'steps':>12} {'folding: held MB':>17} {'all kept: held MB':>18} {'process RSS MB':>15}")
    process = psutil.Process()
    for done in range(BLOCK, args.steps + 1, BLOCK):
        steps = rng.lognormal(np.log(0.020), 0.3, BLOCK)  # ~20 ms steps, skewed
        waits = steps * rng.uniform(0.05, 0.5, BLOCK)
        order = list(clocks) if (done // BLOCK) % 2 else list(reversed(clocks))
        for name in order:
            if name == "every step kept":
                step_clock.EXACT_STEPS = 10**12  # read at each window: this clock never folds
            cpu[name] += feed_block(clocks[name], states[name], steps, waits)
            step_clock.EXACT_STEPS = bound
        if done % 1_000_000 == 0:
            held = [held_bytes(clocks[name]) / 1e6 for name in clocks]
            print(f"{done:>12,} {held[0]:>17.2f} {held[1]:>18.2f} {process.memory_info().rss / 1e6:>15.0f}")
    per_batch = {name: cpu[name] / args.steps * 1e6 for name in clocks}
    for name, us in per_batch.items():
        print(f"{name}: {us:.3f} us of CPU per batch (batch() + windows + folds)")
    print(f"ratio folding / every step kept: {per_batch['folding'] / per_batch['every step kept']:.3f}")
    folded, exact = clocks["folding"].summary(), clocks["every step kept"].summary()
    for q in ("median", "p10", "p90", "mean"):
        a, b = getattr(folded.step_time_ms, q), getattr(exact.step_time_ms, q)
        print(f"step time {q}: folded {a:.4f} ms, exact {b:.4f} ms, relative error {abs(a - b) / b:.2e}")
    print(f"stated relative accuracy: {folded.sketch_relative_accuracy}")


if __name__ == "__main__":
    main()
