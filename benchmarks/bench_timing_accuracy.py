"""How close PerfCallback's DataLoader wait and compute are to the truth.

Each configuration trains a model that sleeps ``compute`` ms per step on a dataset that sleeps ``delay`` ms per
batch, with 0 or 2 DataLoader workers. The truth is measured independently of PerfCallback:

* wait: the time the main process spends inside the DataLoader iterator's ``__next__`` (a wrapper around the
  iterator the DataLoader hands out), which with workers is the real blocked time, not the delay;
* compute: the LightningModule's own ``on_train_batch_start`` -> ``on_train_batch_end`` interval.

The first batch of each epoch is left out on both sides (PerfCallback reports it as epoch start-up).
Target: measured means within 5% + 0.3 ms of the truth.

    python benchmarks/bench_timing_accuracy.py [--steps 60]
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
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from lightning_perf import PerfCallback  # noqa: E402

REL_TOLERANCE = 0.05
ABS_TOLERANCE_MS = 0.3


class SleepyBatches(Dataset):
    """Each item is a whole batch (use with ``batch_size=None``) and costs ``delay_s`` to produce."""

    def __init__(self, n: int, delay_s: float) -> None:
        self.n = n
        self.delay_s = delay_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        if self.delay_s:
            time.sleep(self.delay_s)
        return torch.randn(16, 8), torch.randn(16, 1)


class _TimedIterator:
    def __init__(self, iterator, record: list[float]) -> None:
        self._iterator = iterator
        self._record = record

    def __iter__(self):
        return self

    def __next__(self):
        start = time.perf_counter()
        item = next(self._iterator)
        self._record.append(time.perf_counter() - start)
        return item


class TimedDataLoader(DataLoader):
    """A DataLoader that records how long every ``__next__`` of its iterators blocks the caller."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fetch_s: list[list[float]] = []  # one list per epoch

    def __iter__(self):
        self.fetch_s.append([])
        return _TimedIterator(super().__iter__(), self.fetch_s[-1])


class SleepyModel(L.LightningModule):
    def __init__(self, compute_s: float) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.compute_s = compute_s
        self.batch_s: list[list[float]] = []

    def on_train_epoch_start(self) -> None:
        self.batch_s.append([])

    def on_train_batch_start(self, batch, batch_idx) -> None:
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self.batch_s[-1].append(time.perf_counter() - self._t0)

    def training_step(self, batch, batch_idx):
        time.sleep(self.compute_s)
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def measure(delay_ms: float, compute_ms: float, workers: int, steps: int, root: str) -> dict[str, float]:
    data = TimedDataLoader(SleepyBatches(steps, delay_ms / 1e3), batch_size=None, num_workers=workers)
    model = SleepyModel(compute_ms / 1e3)
    callback = PerfCallback(enable_profiler=False, utilization=False, diagnose=False)
    trainer = L.Trainer(
        default_root_dir=root,
        max_epochs=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.callbacks.append(callback)
    trainer.fit(model, data)
    timing = callback.last_summary.timing
    true_wait = [s for epoch in data.fetch_s for s in epoch[1:]]  # first fetch of an epoch: start-up
    true_compute = [s for epoch in model.batch_s for s in epoch[1:]]
    return {
        "true_wait_ms": statistics.fmean(true_wait) * 1e3,
        "wait_ms": timing.data_wait_ms.mean,
        "true_compute_ms": statistics.fmean(true_compute) * 1e3,
        "compute_ms": timing.compute_ms.mean,
    }


def within(measured: float, truth: float) -> bool:
    return abs(measured - truth) <= REL_TOLERANCE * truth + ABS_TOLERANCE_MS


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--steps", type=int, default=60, help="batches per epoch (two epochs per configuration)"
    )
    parser.add_argument("--compute-ms", type=float, default=5.0)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    print(f"model sleeps {args.compute_ms} ms per step; 2 epochs x {args.steps} batches per configuration")
    print(
        f"{'delay':>6s} {'workers':>7s} | {'true wait':>9s} {'measured':>9s} {'ok':>3s} |"
        f" {'true compute':>12s} {'measured':>9s} {'ok':>3s}"
    )
    failures = 0
    with tempfile.TemporaryDirectory() as root:
        for workers in (0, 2):
            for delay_ms in (0.0, 2.0, 10.0, 30.0):
                r = measure(delay_ms, args.compute_ms, workers, args.steps, root)
                wait_ok = within(r["wait_ms"], r["true_wait_ms"])
                compute_ok = within(r["compute_ms"], r["true_compute_ms"])
                failures += (not wait_ok) + (not compute_ok)
                print(
                    f"{delay_ms:4.0f}ms {workers:7d} | {r['true_wait_ms']:7.2f}ms {r['wait_ms']:7.2f}ms"
                    f" {'yes' if wait_ok else 'NO':>3s} | {r['true_compute_ms']:10.2f}ms {r['compute_ms']:7.2f}ms"
                    f" {'yes' if compute_ok else 'NO':>3s}"
                )
    print(f"tolerance: 5% + {ABS_TOLERANCE_MS} ms; {failures} figure(s) outside it")


if __name__ == "__main__":
    main()
