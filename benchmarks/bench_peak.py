"""The device's matmul peak two ways, in one process: lightning-perf's short measurement against a longer one.

``lightning_perf.probes.device_peak.measure`` times square matmuls of at most 1024 (CPU) for about 0.1 s at the
end of a fit. This benchmark computes the figure independently: ``timeit`` of larger matmuls (2048 and 4096 on a
CPU, 8192 and 16384 on a GPU), repeated, taking the best repeat of each size and the best size (the
"achievable peak" of the usual matmul benchmarks), then prints the ratio of lightning-perf's figure to it. The
two are interleaved round by round so a busy machine hits both alike; the ratio should sit within 2x either way
(the done-when of issue 44: the measured peak against a figure computed by a separate benchmark).

    python benchmarks/bench_peak.py [--dtype fp32] [--device cpu] [--threads N] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import timeit

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from lightning_perf.probes.device_peak import DTYPES, measure  # noqa: E402

SIZES = {"cpu": (2048, 4096), "cuda": (8192, 16384)}


def long_peak(device: torch.device, dtype: torch.dtype, size: int, repeat: int = 3) -> float:
    """Best FLOP/s of ``repeat`` timeit runs of ``number`` matmuls, ``number`` sized to ~0.2 s a run."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)

    def call() -> None:
        torch.mm(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    timer = timeit.Timer(call)
    number, _ = timer.autorange()  # at least 0.2 s a run
    best = min(timer.repeat(repeat=repeat, number=number)) / number
    return 2.0 * size**3 / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    if args.dtype == "tf32":
        torch.set_float32_matmul_precision("high")
    ours, theirs = [], []
    for round_ in range(args.rounds):
        quick, size = measure(device, dtype)
        ours.append(quick)
        best = max(long_peak(device, dtype, n) for n in SIZES.get(device.type, SIZES["cpu"]))
        theirs.append(best)
        print(
            f"round {round_ + 1}: lightning-perf {quick / 1e9:8.1f} GFLOP/s (n={size})   "
            f"benchmark {best / 1e9:8.1f} GFLOP/s   ratio {quick / best:.2f}",
            flush=True,
        )
    ratio = statistics.median(ours) / statistics.median(theirs)
    print(
        f"\n{args.dtype} on {args.device} ({torch.get_num_threads()} threads): lightning-perf's measured peak "
        f"{statistics.median(ours) / 1e9:.1f} GFLOP/s, the benchmark's {statistics.median(theirs) / 1e9:.1f} "
        f"GFLOP/s (medians of {args.rounds} rounds): ratio {ratio:.2f} "
        f"({'within' if 0.5 <= ratio <= 2.0 else 'NOT within'} 2x)"
    )


if __name__ == "__main__":
    main()
