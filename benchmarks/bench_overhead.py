"""What PerfCallback costs the training it watches, as ratios measured in one process.

A tiny model whose steps take well under a millisecond is trained for ``--steps`` batches under each variant;
the variants run interleaved (each round visits all of them in a rotated order) so drift and noise hit all
alike, and each is reported as the median over rounds of its training-loop time, divided by the empty
``Callback()`` variant (Lightning's own hook dispatch makes any callback cost a few percent on such steps: that
is the floor) and by the no-callback variant.

The loop time is taken inside the LightningModule's own ``on_train_start``/``on_train_end`` hooks, which
Lightning calls in every variant, so the stopwatch adds no callback of its own.

    python benchmarks/bench_overhead.py [--steps 3000] [--rounds 9]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, DeviceStatsMonitor
from lightning.pytorch.profilers import SimpleProfiler
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from lightning_perf import PerfCallback  # noqa: E402


class TinyTimedModel(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.loop_s = 0.0

    def on_train_start(self) -> None:
        self._t0 = time.perf_counter()

    def on_train_end(self) -> None:
        self.loop_s = time.perf_counter() - self._t0

    def training_step(self, batch, batch_idx):
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
        "PerfCallback default schedule": dict(callbacks=[PerfCallback(diagnose=False)]),
        "Lightning SimpleProfiler": dict(callbacks=[], profiler="simple"),  # report written to a file below
        "DeviceStatsMonitor": dict(callbacks=[DeviceStatsMonitor(cpu_stats=True)]),
    }


def run_once(name: str, options: dict, steps: int, data: DataLoader, root: str) -> float:
    model = TinyTimedModel()
    if options.get("profiler") == "simple":
        # to a file, not stdout (same profiler, same cost)
        options = {**options, "profiler": SimpleProfiler(dirpath=root, filename="simple")}
    trainer = L.Trainer(
        default_root_dir=os.path.join(root, name.replace(" ", "_")),
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
    trainer.fit(model, data)
    return model.loop_s


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    data = DataLoader(TensorDataset(torch.randn(4096, 8), torch.randn(4096, 1)), batch_size=4)
    names = list(variants())
    times: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as root:
        run_once("warm-up", dict(callbacks=[]), 200, data, root)
        for round_index in range(args.rounds):
            order = names[round_index % len(names) :] + names[: round_index % len(names)]
            for name in order:
                # fresh callbacks every run: nothing carries over between runs
                times[name].append(run_once(name, variants()[name], args.steps, data, root))
    base_empty = statistics.median(times["empty Callback()"])
    base_none = statistics.median(times["no callback"])
    print(f"{args.steps} steps x {args.rounds} interleaved rounds; median loop time per variant")
    print(f"{'variant':48s} {'ms/step':>8s} {'vs empty Callback':>18s} {'vs no callback':>15s}")
    for name in names:
        median = statistics.median(times[name])
        print(
            f"{name:48s} {median / args.steps * 1e3:8.3f} {median / base_empty:17.3f}x {median / base_none:14.3f}x"
        )
    sampler_cost = statistics.median(times["PerfCallback idle + utilization sampler"]) / statistics.median(
        times["PerfCallback idle (no profiler, no sampler)"]
    )
    print(f"utilization sampler alone: {sampler_cost:.4f}x (idle PerfCallback with vs without the sampler)")


if __name__ == "__main__":
    main()
