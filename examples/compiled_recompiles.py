"""A compiled model that keeps recompiling, named by lightning-perf, and the fix that removes the recompiles.

    python examples/compiled_recompiles.py                       # eager backend: well under a minute on a CPU
    python examples/compiled_recompiles.py --backend inductor    # real code generation (~20 s a compile on CPU)

A small sequence model (per-token MLP, mean over the tokens, a linear head) trains on synthetic variable-length
sequences, each batch padded to its longest sequence: the usual collate of text and audio models. The length
dimension therefore changes from batch to batch.

1. **before**: ``torch.compile(model, dynamic=False)``. Every new length fails dynamo's size guard and recompiles,
   until dynamo hits its recompile limit (8) and runs the step uncompiled. ``PerfCallback`` records each
   compilation (the step, its time, the failing guard), keeps those steps out of the step statistics and
   reports a ``recompilation`` finding naming the varying dimension and the fix.
2. **after**: the same fit with the finding's settings change applied (``dynamic=True``): one compilation, no
   recompiles, no finding.

The runs land in ``--log-dir`` (``perf_logs/compiled_recompiles/{before,after}``) for TensorBoard
(``perf_compile/time_s``, ``perf_compile/recompiles``) and ``lightning-perf compare``.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_perf import PerfCallback
from lightning_perf.analysis.summary import RunSummary

RUN_NAME = "compiled_recompiles"
FEATURES = 16
HIDDEN = 64
# sequence lengths drawn per sample; 0 and 1 are kept out (dynamo specialises those sizes even when dynamic)
MIN_LENGTH, MAX_LENGTH = 8, 64
DEFAULT_STEPS = 40
DEFAULT_BATCH_SIZE = 16
SEED = 0


class VariableLengthSequences(Dataset):
    """``n`` random sequences of ``FEATURES`` channels and lengths in [MIN_LENGTH, MAX_LENGTH], with a target."""

    def __init__(self, n: int, seed: int = SEED) -> None:
        generator = torch.Generator().manual_seed(seed)
        lengths = torch.randint(MIN_LENGTH, MAX_LENGTH + 1, (n,), generator=generator)
        self.samples = [torch.randn(int(length), FEATURES, generator=generator) for length in lengths]
        self.targets = torch.randn(n, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.samples[index], self.targets[index]


def pad_collate(batch: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad each batch to its longest sequence: (batch, length, features); the length varies per batch."""
    sequences, targets = zip(*batch, strict=True)
    return nn.utils.rnn.pad_sequence(list(sequences), batch_first=True), torch.stack(targets)


class SequenceRegressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.token = nn.Sequential(
            nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU()
        )
        self.head = nn.Linear(HIDDEN, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.token(x).mean(dim=1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def fit(args: argparse.Namespace, version: str, dynamic: bool) -> RunSummary:
    """One compiled fit of ``args.steps`` batches; its summary."""
    torch._dynamo.reset()  # dynamo caches compiled code per function: each run starts from nothing
    torch.manual_seed(SEED)
    model = torch.compile(SequenceRegressor(), backend=args.backend, dynamic=dynamic)
    loader = DataLoader(
        VariableLengthSequences(args.steps * args.batch_size),
        batch_size=args.batch_size,
        shuffle=True,
        collate_fn=pad_collate,
        drop_last=True,
        generator=torch.Generator().manual_seed(SEED),
    )
    callback = PerfCallback(enable_profiler=False, probe_num_workers="never", ab_cudnn_benchmark=False)
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=TensorBoardLogger(args.log_dir, name=RUN_NAME, version=version),
        callbacks=[callback],
        log_every_n_steps=5,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        trainer.fit(model, loader)
    assert callback.last_summary is not None
    return callback.last_summary


def describe(name: str, summary: RunSummary) -> str:
    comp = summary.compile
    step = summary.timing.step_time_ms
    median = (
        f"median step {step.median:.1f} ms over {summary.timing.steps} steps" if step else "no timed step"
    )
    if comp is None:
        return f"{name}: nothing compiled; {median}"
    limit = ", recompile limit hit" if comp.recompile_limit_hit else ""
    return (
        f"{name}: {comp.compiles} compilation(s), {comp.recompiles} recompile(s){limit}, {comp.total_s:.2f} s "
        f"compiling, {comp.steps_excluded} step(s) left out of the step statistics; {median}"
    )


def run(args: argparse.Namespace) -> int:
    before = fit(args, "before", dynamic=False)
    finding = next((f for f in before.findings if f.id == "recompilation"), None)
    print(describe("before", before))
    if finding is None:
        print("before: no recompilation finding (unexpected: every batch length differs)")
        return 1
    print(f"finding [{finding.severity}] {finding.title}\n  evidence: {finding.evidence}")
    print(f"  fix: {finding.recommendation}\n  settings change: {finding.settings_change}")
    after = fit(args, "after", dynamic=bool(finding.settings_change.get("dynamic", True)))
    print(describe("after", after))
    left = [f.id for f in after.findings if f.id in ("recompilation", "graph_breaks")]
    print("after: " + (f"still {', '.join(left)}" if left else "no recompilation finding"))
    print(f"tensorboard --logdir {os.path.join(args.log_dir, RUN_NAME)}")
    return 1 if left else 0


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--backend", default="eager", help="torch.compile backend: eager (fast), inductor, ..."
    )
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="training batches per run")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE)
    parser.add_argument("--log-dir", default="perf_logs")
    args = parser.parse_args(argv)
    for flag, value in (("--steps", args.steps), ("--batch-size", args.batch_size)):
        if value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return run(parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
