"""What a DataLoader worker's hand-off of one batch costs on this machine, and what it does to a quick loader.

Part 1, the hand-off: :func:`lightning_perf.probes.handoff.measure_handoff` (the measurement the callback makes at
the end of an input-bound fit) on in-memory loaders of a few batch sizes and sample sizes: the steady wall time
per batch that one worker replaying a ready batch delivers (``ms/batch``) and this thread's CPU time per batch
received (``main ms``), beside the batch's bytes. Each row is measured ``--repeats`` times; the median and range
are printed.

Part 2, the step: a tiny model on in-memory tensors (the loaders of issue 42, where one worker made a 0.72 ms step
3.2 ms) trained by a plain loop with 0, 1 and 2 workers, interleaved in rounds (0 1 2, 1 2 0, ...), the mean step
of each side over ``--steps`` steps after ``--warmup``; the ratio of each worker count's step to 0 workers' is
printed with the range over the rounds. Both parts in one process.

    python benchmarks/bench_handoff.py [--repeats 5] [--rounds 5] [--steps 300]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from lightning_perf.probes.handoff import measure_handoff  # noqa: E402

# (label, samples, shape of one sample, batch size)
LOADERS = [
    ("batch 2 of 32 floats", 512, (32,), 2),
    ("batch 4 of 32 floats", 512, (32,), 4),
    ("batch 64 of 32 floats", 2048, (32,), 64),
    ("batch 16 of 3x64x64", 256, (3, 64, 64), 16),
    ("batch 16 of 3x256x256", 64, (3, 256, 256), 16),
]


def part_handoff(repeats: int) -> None:
    print(f"{'loader':<24} {'bytes':>10} {'ms/batch':>18} {'main ms':>16}")
    for label, samples, shape, batch in LOADERS:
        loader = DataLoader(
            TensorDataset(torch.randn(samples, *shape), torch.randn(samples, 1)), batch_size=batch
        )
        found = [measure_handoff(loader) for _ in range(repeats)]
        if any(f.error for f in found):
            print(f"{label:<24} error: {next(f.error for f in found if f.error)}")
            continue
        wall = [f.ms_per_batch for f in found]
        main = [f.main_ms for f in found]
        print(
            f"{label:<24} {found[0].batch_bytes:>10} "
            f"{statistics.median(wall):>7.3f} ({min(wall):.3f}-{max(wall):.3f}) "
            f"{statistics.median(main):>6.3f} ({min(main):.3f}-{max(main):.3f})"
        )


def _mean_step_ms(loader: DataLoader, model: nn.Module, steps: int, warmup: int) -> float:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    done, start = 0, None
    while done < steps + warmup:
        for x, y in loader:
            if done == warmup:
                start = time.perf_counter()
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            done += 1
            if done >= steps + warmup:
                break
    assert start is not None
    return (time.perf_counter() - start) * 1e3 / steps


def part_steps(rounds: int, steps: int, warmup: int) -> None:
    torch.set_num_threads(1)
    data = TensorDataset(torch.randn(4096, 32), torch.randn(4096, 1))
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    counts = (0, 1, 2)
    loaders = {n: DataLoader(data, batch_size=4, num_workers=n, persistent_workers=n > 0) for n in counts}
    means: dict[int, list[float]] = {n: [] for n in counts}
    for round_ in range(rounds):
        order = counts[round_ % 3 :] + counts[: round_ % 3]
        for n in order:
            means[n].append(_mean_step_ms(loaders[n], model, steps, warmup))
    print(f"\nin-memory tensors, batch 4, a 32-64-1 MLP, {rounds} interleaved rounds of {steps} steps:")
    for n in counts:
        ratios = [m / z for m, z in zip(means[n], means[0], strict=True)]
        print(
            f"  num_workers={n}: mean step {statistics.median(means[n]):.3f} ms; "
            f"x{statistics.median(ratios):.2f} of 0 workers ({min(ratios):.2f}-{max(ratios):.2f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    part_handoff(args.repeats)
    part_steps(args.rounds, args.steps, args.warmup)


if __name__ == "__main__":
    main()
