"""What the utilization sampler costs the training it watches.

The sampler thread shares the GIL with training. This times a CPU-bound pure-Python loop of ~1 ms "steps"
alone and with a running UtilSampler, interleaved (alone, with, with, alone, ...) in one process so that
machine drift hits both alike, and prints the median ratio. It also times ``sample_once()`` directly:
the per-sample work times the sampling rate is the share of one core the sampler takes.

    python benchmarks/bench_sampler_cost.py [--interval 0.1] [--repeats 10] [--seconds 1.0] [--workers 4]

``--workers`` starts idle child processes, as DataLoader workers would be, since each one is read every
sample. On a machine with CUDA the sampler also reads NVML for the current device. No asserts: read the
figures (target: at most 0.5% on 1 ms steps). On a shared machine the ratios wander by a few percent
either way; the direct per-sample figures are the steadier measure.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import statistics
import time

from lightning_perf import utilization
from lightning_perf.utilization import UtilSampler


def step() -> int:
    """About a millisecond of pure-Python work (the GIL held throughout, like a Python-heavy step)."""
    total = 0
    for i in range(25_000):
        total += i * i % 7
    return total


def run_loop(seconds: float, steps: int | None = None) -> tuple[float, int]:
    """Run steps for ``seconds`` (or exactly ``steps`` of them); returns (elapsed s, steps)."""
    start = time.perf_counter()
    done = 0
    while (steps is None and time.perf_counter() - start < seconds) or (steps is not None and done < steps):
        step()
        done += 1
    return time.perf_counter() - start, done


def cuda_devices() -> list[int] | None:
    try:
        import torch

        return [torch.cuda.current_device()] if torch.cuda.is_available() else None
    except Exception:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=0.1, help="sampler interval_s")
    parser.add_argument("--repeats", type=int, default=10, help="alone/with pairs")
    parser.add_argument("--seconds", type=float, default=1.0, help="length of one timed loop")
    parser.add_argument("--workers", type=int, default=0, help="idle child processes to read each sample")
    args = parser.parse_args()

    children = [
        multiprocessing.Process(target=time.sleep, args=(3600,), daemon=True) for _ in range(args.workers)
    ]
    for child in children:
        child.start()
    try:
        devices = cuda_devices()
        elapsed, steps = run_loop(args.seconds)  # warm-up, and the number of steps in one timed loop
        print(f"step: {1000 * elapsed / steps:.2f} ms, {steps} steps per loop, GPU: {devices or 'none'}")

        ratios = []
        best = {False: math.inf, True: math.inf}
        for repeat in range(args.repeats):
            times = {}
            # alternate the order (ABBA) so a trend over time does not favour one side
            for with_sampler in (False, True) if repeat % 2 == 0 else (True, False):
                sampler = UtilSampler(args.interval, devices) if with_sampler else None
                if sampler is not None:
                    sampler.start()  # NVML init and the first /proc scan happen here, outside the timing
                times[with_sampler], _ = run_loop(args.seconds, steps)
                best[with_sampler] = min(best[with_sampler], times[with_sampler])
                if sampler is not None:
                    sampler.stop()
            ratios.append(times[True] / times[False])
            print(f"  repeat {repeat}: with/alone = {ratios[-1]:.4f}")
        median = statistics.median(ratios)
        print(f"median ratio with/alone over {len(ratios)} pairs: {median:.4f} ({100 * (median - 1):+.2f}%)")
        # on a shared machine other tenants only ever slow a loop down: the fastest loops are the cleanest
        print(f"fastest with / fastest alone: {best[True] / best[False]:.4f}")

        sampler = UtilSampler(args.interval, devices)
        sampler.start()  # opened; the thread's own samples are rare next to the ones timed here
        count = 2000
        start = time.perf_counter()
        for _ in range(count):
            sampler.sample_once()
        per_sample = (time.perf_counter() - start) / count
        sampler.stop()
        print(
            f"sample_once(): {1e6 * per_sample:.1f} us with {len(children)} workers; at one sample per "
            f"{args.interval} s that is {100 * per_sample / args.interval:.3f}% of one core"
        )
        import psutil

        start = time.perf_counter()
        psutil.Process().children(recursive=True)  # the worker rediscovery scan: every process in /proc
        scan = time.perf_counter() - start
        period = max(utilization.CHILD_RESCAN_S, scan / utilization.CHILD_SCAN_MAX_SHARE)
        print(
            f"worker scan: {1e3 * scan:.2f} ms every {period:.1f} s = {100 * scan / period:.3f}% of one core"
        )
        if sampler.gpu_unavailable_reason:
            print(f"GPU not sampled: {sampler.gpu_unavailable_reason}")
    finally:
        for child in children:
            child.terminate()
            child.join()


if __name__ == "__main__":
    main()
