"""What PerfCallback costs the training it watches, as ratios measured in one process, end to end.

A tiny model whose steps take a millisecond or two is trained for ``--steps`` batches under each variant; the
variants run interleaved (each round visits all of them in a rotated order) so drift and noise hit all alike.
Printed first, per variant: **the fit's wall time per batch**, from the module's ``on_train_start`` to the end
of its last batch (the batches as a fit runs them: the hooks, the logging windows, the profiled cycles, the
sampler thread), as the median over rounds of the ratio to the empty ``Callback()`` variant of the same round
(Lightning's own hook dispatch makes any callback cost a few percent on such steps: that is the floor); then
**the end of the fit**, from the end of the last batch to ``trainer.fit``'s return (the summary, the diagnosis,
the writes), in seconds. The training thread's CPU time over the batches (``time.thread_time``) is shown beside
the wall time: on a loaded machine it leaves out the time other processes hold the core.

Then the callback's own cost per batch in microseconds (a micro-benchmark of part of the work, not what a fit
pays): inside a real fit (the callback in its measuring state), one "batch" of PerfCallback's work (the timed
fetch wrapper and its listener, ``on_train_batch_start``/``on_train_batch_end``) is timed over many calls,
interleaved round by round with the same calls on an empty ``Callback()`` and an untimed fetcher, in the
training thread's CPU time; the per-round differences give the cost and its 95% interval (Student t,
``scipy.stats.ttest_1samp``).

    python benchmarks/bench_overhead.py [--steps 3000] [--rounds 9] [--calls 20000] [--micro-only] [--pad-ms 1.3]

``--pad-ms`` spins in each training_step, so that a fast machine's step is as long as a slower one's (the
tiny model's step is ~0.65 ms on a quiet 2-core VM, ~1.7 ms on a loaded one)."""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, DeviceStatsMonitor
from lightning.pytorch.profilers import PassThroughProfiler, SimpleProfiler
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from lightning_perf import PerfCallback  # noqa: E402
from lightning_perf.collect.steps import fetch_timing  # noqa: E402

# idle cost target above an empty Callback (issue 16): 2 us a batch, 0.4% of a 0.5 ms step
TARGET_US = 2.0
PAD_S = 0.0  # set by --pad-ms


class TinyTimedModel(L.LightningModule):
    """Times its own batches: from its ``on_train_start`` (after the callbacks') to the end of its last batch
    (its ``on_train_batch_end`` runs after the callbacks'), in wall and in the training thread's CPU time. The
    same two clock reads a batch in every variant."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.loop_s = self.loop_cpu_s = 0.0
        self.last_batch_end = 0.0

    def on_train_start(self) -> None:
        self._t0, self._cpu0 = time.perf_counter(), time.thread_time()

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self.last_batch_end = time.perf_counter()
        self.loop_s = self.last_batch_end - self._t0
        self.loop_cpu_s = time.thread_time() - self._cpu0

    def training_step(self, batch, batch_idx):
        if PAD_S:  # --step-ms: the training thread computes (spins) this much longer, a slower machine's step
            until = time.perf_counter() + PAD_S
            while time.perf_counter() < until:
                pass
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def variants() -> dict[str, dict]:
    return {
        "no callback": dict(callbacks=[]),
        "empty Callback()": dict(callbacks=[Callback()]),
        "PerfCallback idle (no profiler, no sampler)": dict(
            callbacks=[PerfCallback(enable_profiler=False, utilization=False, diagnose=False)]
        ),
        "PerfCallback idle + utilization sampler": dict(
            callbacks=[PerfCallback(enable_profiler=False, utilization=True, diagnose=False)]
        ),
        # all defaults: the profiled cycle, the step anatomy, the sampler, the diagnosis and its probes at the end
        "PerfCallback() defaults": dict(callbacks=[PerfCallback()]),
        "Lightning SimpleProfiler": dict(callbacks=[], profiler="simple"),  # report written to a file below
        "DeviceStatsMonitor": dict(callbacks=[DeviceStatsMonitor(cpu_stats=True)]),
    }


def quiet_trainer(root: str, steps: int, **options) -> L.Trainer:
    """A Trainer for ``steps`` training steps: logging every 50 steps, no progress bar, checkpoints or validation."""
    return L.Trainer(
        default_root_dir=root,
        max_steps=steps,
        max_epochs=-1,
        logger=True,
        log_every_n_steps=50,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        **options,
    )


@dataclass
class Fit:
    """One fit's figures: its batches' wall and CPU seconds, and the end of the fit (last batch to return)."""

    loop_s: float
    loop_cpu_s: float
    end_s: float


def run_once(name: str, options: dict, steps: int, data: DataLoader, root: str) -> Fit:
    model = TinyTimedModel()
    if options.get("profiler") == "simple":
        # to a file, not stdout (same profiler, same cost)
        options = {**options, "profiler": SimpleProfiler(dirpath=root, filename="simple")}
    trainer = quiet_trainer(os.path.join(root, name.replace(" ", "_")), steps, **options)
    trainer.fit(model, data)
    return Fit(model.loop_s, model.loop_cpu_s, time.perf_counter() - model.last_batch_end)


class ConstFetcher:
    """Stands in for Lightning's data fetcher: ``next()`` returns the same batch, so only the wrapper is timed."""

    def __init__(self, batch) -> None:
        self.batch = batch

    def __next__(self):
        return self.batch


FETCH = "[_TrainingEpochLoop].train_dataloader_next"


def lightning_batch(profiler, fetcher, callback, trainer, module, outputs, batch, index) -> None:
    """One training batch's calls to ``trainer.profiler`` as Lightning 2.6 makes them (recorded from a real fit
    of this model: the fetch's start/stop, 18 named hooks, nested as Lightning nests them, and the callback's two
    batch hooks), with the callback's hooks called inside their spans. PerfCallback puts its hook profiler in
    ``trainer.profiler``'s place, so this is the part of its per-batch cost that happens in Lightning's calls."""
    profiler.start(FETCH)
    next(fetcher)
    profiler.stop(FETCH)
    profile = profiler.profile
    with profile("[LightningModule]MicroBenchModel.on_before_batch_transfer"):
        pass
    with profile("[Strategy]SingleDeviceStrategy.batch_to_device"):
        with profile("[LightningModule]MicroBenchModel.transfer_batch_to_device"):
            pass
        with profile("[LightningModule]MicroBenchModel.on_after_batch_transfer"):
            pass
    with profile(f"[Callback]{callback.state_key}.on_train_batch_start"):
        callback.on_train_batch_start(trainer, module, batch, index)
    with profile("[LightningModule]MicroBenchModel.on_train_batch_start"):
        pass
    with profile("[Strategy]SingleDeviceStrategy.on_train_batch_start"):
        pass
    with profile("run_training_batch"), profile("[LightningModule]MicroBenchModel.optimizer_step"):
        with profile("[Strategy]SingleDeviceStrategy.training_step"):
            pass
        with profile("[LightningModule]MicroBenchModel.on_before_zero_grad"):
            pass
        with profile("[LightningModule]MicroBenchModel.optimizer_zero_grad"):
            pass
        with profile("[Strategy]SingleDeviceStrategy.backward"):
            with profile("[LightningModule]MicroBenchModel.on_before_backward"):
                pass
            with profile("[LightningModule]MicroBenchModel.on_after_backward"):
                pass
        with profile("[LightningModule]MicroBenchModel.on_before_optimizer_step"):
            pass
        with profile("[LightningModule]MicroBenchModel.configure_gradient_clipping"):
            pass
    with profile(f"[Callback]{callback.state_key}.on_train_batch_end"):
        callback.on_train_batch_end(trainer, module, outputs, batch, index)
    with profile("[LightningModule]MicroBenchModel.on_train_batch_end"):
        pass


class MicroBenchModel(TinyTimedModel):
    """At its last batch, times one batch's worth of PerfCallback work against an empty Callback's, in place:
    the callback's own work alone, and with Lightning's calls to ``trainer.profiler`` of a batch (PerfCallback's
    hook profiler against Lightning's default ``PassThroughProfiler``)."""

    def __init__(self, steps: int, calls: int, rounds: int) -> None:
        super().__init__()
        self.steps, self.calls, self.rounds = steps, calls, rounds
        self.per_round_us: list[tuple[float, float]] = []
        self.with_hooks_us: list[tuple[float, float]] = []

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if batch_idx != self.steps - 1:
            return
        trainer = self.trainer
        perf = next(cb for cb in trainer.callbacks if isinstance(cb, PerfCallback))
        empty = next(cb for cb in trainer.callbacks if type(cb) is Callback)
        timed = ConstFetcher(batch)
        assert fetch_timing.instrument(timed, perf._fit), "the fit's session is not open"
        plain = ConstFetcher(batch)
        for round_index in range(self.rounds):
            pair = [(perf, timed), (empty, plain)]
            if round_index % 2:  # alternate which goes first, so neither always runs on a warm cache
                pair.reverse()
            costs = {id(cb): self._time(cb, fetcher, trainer, outputs, batch) for cb, fetcher in pair}
            self.per_round_us.append((costs[id(perf)], costs[id(empty)]))
            profilers = {id(perf): trainer.profiler, id(empty): PassThroughProfiler()}
            costs = {
                id(cb): self._time_with_hooks(profilers[id(cb)], cb, fetcher, trainer, outputs, batch)
                for cb, fetcher in pair
            }
            self.with_hooks_us.append((costs[id(perf)], costs[id(empty)]))

    def _time(self, callback, fetcher, trainer, outputs, batch) -> float:
        # the training thread's CPU time: what the callback takes from training, without the time other
        # processes hold the core (on a shared machine that would be most of the noise)
        start = time.thread_time()
        for index in range(self.calls):
            next(fetcher)
            callback.on_train_batch_start(trainer, self, batch, index)
            callback.on_train_batch_end(trainer, self, outputs, batch, index)
        return (time.thread_time() - start) / self.calls * 1e6

    def _time_with_hooks(self, profiler, callback, fetcher, trainer, outputs, batch) -> float:
        start = time.thread_time()
        for index in range(self.calls):
            lightning_batch(profiler, fetcher, callback, trainer, self, outputs, batch, index)
        return (time.thread_time() - start) / self.calls * 1e6


def _difference(label: str, pairs: list[tuple[float, float]]) -> float:
    from scipy.stats import ttest_1samp

    diffs = [p - e for p, e in pairs]
    interval = ttest_1samp(diffs, 0.0).confidence_interval(0.95)
    mean = statistics.fmean(diffs)
    perf_us = statistics.median(p for p, _ in pairs)
    empty_us = statistics.median(e for _, e in pairs)
    print(f"  {label}")
    print(f"    PerfCallback {perf_us:7.2f} us/batch, empty Callback() {empty_us:7.2f} us/batch (medians)")
    # one disturbed round moves the mean (and widens its interval) far more than the median of the pairs
    print(f"    median of the per-round differences: {statistics.median(diffs):.2f} us/batch")
    print(
        f"    cost above an empty Callback: {mean:.2f} us/batch, 95% interval {interval.low:.2f}-"
        f"{interval.high:.2f} us (target <= {TARGET_US:g} us: {'met' if interval.high <= TARGET_US else 'not met'})"
    )
    return mean


def micro_benchmark(calls: int, rounds: int, data: DataLoader, root: str) -> None:
    steps = 60
    model = MicroBenchModel(steps, calls, rounds)
    perf = PerfCallback(enable_profiler=False, utilization=False, diagnose=False)
    trainer = quiet_trainer(os.path.join(root, "micro"), steps, callbacks=[perf, Callback()])
    trainer.fit(model, data)
    print(f"\nper-batch cost of PerfCallback, {calls} calls x {rounds} interleaved rounds")
    own = _difference("its own work: fetch wrapper + listener + batch hooks", model.per_round_us)
    whole = _difference(
        "with Lightning's calls to trainer.profiler of a batch (its hook profiler against PassThroughProfiler)",
        model.with_hooks_us,
    )
    for step_ms in (0.5, 5.0, 50.0):
        print(
            f"  on a {step_ms:g} ms step that is {1 + own / (step_ms * 1e3):.4f}x (own work), "
            f"{1 + whole / (step_ms * 1e3):.4f}x (with Lightning's hook timing)"
        )


def _ratios(fits: dict[str, list[Fit]], name: str, base: str, field: str) -> list[float]:
    """Each round's figure of the variant over the base variant's of the same round."""
    return [getattr(f, field) / getattr(b, field) for f, b in zip(fits[name], fits[base], strict=True)]


def _paired(fits: dict[str, list[Fit]], name: str, base: str, field: str) -> float:
    """The median over rounds of the variant's figure over the base variant's of the same round."""
    return statistics.median(_ratios(fits, name, base, field))


def report(fits: dict[str, list[Fit]], steps: int, rounds: int) -> None:
    empty, perf = "empty Callback()", "PerfCallback() defaults"
    pad = f", training_step padded by {PAD_S * 1e3:g} ms" if PAD_S else ""
    print(f"{steps} steps x {rounds} interleaved rounds{pad} (load average {os.getloadavg()[0]:.1f})")
    print(
        f"per batch, end to end: PerfCallback() (its defaults, the step anatomy on) {_paired(fits, perf, empty, 'loop_s'):.4f}x"
        f" an empty Callback() (the fit's wall time from its first batch to its last, median of the rounds' ratios;"
        f" training thread's CPU time {_paired(fits, perf, empty, 'loop_cpu_s'):.4f}x)"
    )
    spread = sorted(_ratios(fits, perf, empty, "loop_s"))
    noise = sorted(_ratios(fits, "no callback", empty, "loop_s"))
    print(
        f"  the rounds' ratios {spread[0]:.3f}-{spread[-1]:.3f}x; the machine's noise: no callback against an empty"
        f" Callback() {noise[0]:.3f}-{noise[-1]:.3f}x"
    )
    end_perf = statistics.median(f.end_s for f in fits[perf])
    end_empty = statistics.median(f.end_s for f in fits[empty])
    print(
        f"end of fit (last batch to trainer.fit's return, median): PerfCallback {end_perf:.3f} s "
        f"(max {max(f.end_s for f in fits[perf]):.3f} s), empty Callback() {end_empty:.3f} s"
    )
    header = f"{'variant':44s} {'ms/step':>8s} {'wall vs empty':>14s} {'cpu vs empty':>13s} {'vs none':>8s} {'end of fit':>11s}"
    print(header)
    for name, runs in fits.items():
        print(
            f"{name:44s} {statistics.median(f.loop_s for f in runs) / steps * 1e3:8.3f} "
            f"{_paired(fits, name, empty, 'loop_s'):13.4f}x {_paired(fits, name, empty, 'loop_cpu_s'):12.4f}x "
            f"{_paired(fits, name, 'no callback', 'loop_s'):7.3f}x {statistics.median(f.end_s for f in runs):9.3f} s"
        )
    sampler = _paired(
        fits,
        "PerfCallback idle + utilization sampler",
        "PerfCallback idle (no profiler, no sampler)",
        "loop_s",
    )
    print(f"utilization sampler alone: {sampler:.4f}x (idle PerfCallback with vs without the sampler)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=20000, help="calls per round of the per-batch benchmark")
    parser.add_argument("--micro-only", action="store_true", help="only the per-batch cost in microseconds")
    parser.add_argument(
        "--pad-ms",
        type=float,
        default=0.0,
        help="spin this long in each training_step (a ~2 ms step on a fast machine)",
    )
    args = parser.parse_args()
    global PAD_S
    PAD_S = args.pad_ms / 1e3
    warnings.filterwarnings("ignore")
    # the findings of every fit would fill the screen: the diagnosis still runs, its lines are not printed
    logging.getLogger("lightning_perf").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    data = DataLoader(TensorDataset(torch.randn(4096, 8), torch.randn(4096, 1)), batch_size=4)
    if args.micro_only:
        with tempfile.TemporaryDirectory() as root:
            micro_benchmark(args.calls, max(args.rounds, 5), data, root)
        return
    names = list(variants())
    fits: dict[str, list[Fit]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as root:
        # a warm-up of each: the process's first imports, profiler start and peak measurement
        for name in names:
            run_once(f"warm-up {name}", variants()[name], 200, data, root)
        for round_index in range(args.rounds):
            order = names[round_index % len(names) :] + names[: round_index % len(names)]
            for name in order:
                # fresh callbacks every run: nothing carries over between runs
                fits[name].append(run_once(name, variants()[name], args.steps, data, root))
    report(fits, args.steps, args.rounds)
    with tempfile.TemporaryDirectory() as root:
        micro_benchmark(args.calls, max(args.rounds, 5), data, root)


if __name__ == "__main__":
    main()
