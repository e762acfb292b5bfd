"""What timing every hook costs: Lightning's default profiler against the step anatomy's stand-in, per hook.

Lightning wraps every hook it calls in ``trainer.profiler.profile(name)``. During a fit PerfCallback puts its
:class:`~lightning_perf.collect.steps.hook_profiler.HookProfiler` there (issue 43). Both are timed here in one
process, interleaved round by round, on an empty hook body, on a hook nested in another (the stand-in keeps
self time) and on a start/stop pair (Lightning times the fetch so), and the batch rotation the step clock calls
once a batch.

    python benchmarks/bench_hook_profiler.py [--calls 200000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import timeit

from lightning.pytorch.profilers import PassThroughProfiler

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from lightning_perf.collect.steps.hook_profiler import HookProfiler  # noqa: E402

NAME = "[Callback]ModelCheckpoint.on_train_batch_end"
OUTER = "[Strategy]SingleDeviceStrategy.backward"
FETCH = "[_TrainingEpochLoop].train_dataloader_next"


def one_hook(profiler) -> None:
    with profiler.profile(NAME):
        pass


def nested(profiler) -> None:
    with profiler.profile(OUTER), profiler.profile(NAME):  # entered in order, as Lightning nests them
        pass


def start_stop(profiler) -> None:
    profiler.start(FETCH)
    profiler.stop(FETCH)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    default = PassThroughProfiler()
    ours = HookProfiler(PassThroughProfiler(), {})
    cases = {
        "one hook": one_hook,
        "a hook inside another": nested,
        "a start/stop pair": start_stop,
    }
    print(f"{args.calls} calls x {args.rounds} interleaved rounds, median us a call")
    print(f"{'case':28s} {'PassThroughProfiler':>20s} {'HookProfiler':>13s} {'ratio':>7s}")
    for label, case in cases.items():
        times: dict[str, list[float]] = {"default": [], "ours": []}
        for _ in range(args.rounds):
            for name, profiler in (("default", default), ("ours", ours)):
                seconds = timeit.timeit(lambda p=profiler, c=case: c(p), number=args.calls)
                times[name].append(seconds / args.calls * 1e6)
                ours.next_batch()  # keeps the per-batch dict small, as the step clock does once a batch
        a, b = statistics.median(times["default"]), statistics.median(times["ours"])
        print(f"{label:28s} {a:20.3f} {b:13.3f} {b / a:6.2f}x")
    rotation = timeit.repeat(ours.next_batch, number=args.calls, repeat=args.rounds)
    print(f"batch rotation (once a batch): {statistics.median(rotation) / args.calls * 1e6:.3f} us")


if __name__ == "__main__":
    main()
