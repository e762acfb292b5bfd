"""The small CNN of the classic MNIST profiling example, profiled in inference with PerfCallback.

    python examples/cnn_inference.py                          # synthetic 28x28 digits, runs offline
    python examples/cnn_inference.py --data mnist --data-dir data   # real MNIST (downloaded)

Trains the CNN for a few steps, then profiles inference (``trainer.validate``: eval mode, no gradients) with
``PerfCallback``, and logs what TensorBoard users expect beside the profile: loss and accuracy scalars,
weight histograms and the model graph. On synthetic data the labels are random, so accuracy stays near 10%.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Literal

import lightning as L
import torch
import torch.nn.functional as F
import torchvision
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

from lightning_perf import PerfCallback
from lightning_perf.analysis.summary import RunSummary
from lightning_perf.analysis.verdicts.comparison import format_value

NUM_CLASSES = 10
IMAGE_SHAPE = (1, 28, 28)
# mean and standard deviation of the MNIST training pixels (the values torchvision users quote)
MNIST_MEAN = (0.1307,)
MNIST_STD = (0.3081,)
# FakeData seeds each image from its index plus this offset: keeps evaluation images apart from training ones
FAKE_EVAL_OFFSET = 1_000_000
DATA_CHOICES = ("synthetic", "mnist")

RUN_NAME = "cnn_inference"
# profiled over evaluation batches: 1 skipped, then two cycles of 1 idle, 1 warm-up and 3 recorded batches
SCHEDULE = dict(skip_first=1, wait=1, warmup=1, active=3, repeat=2)
DEFAULT_TRAIN_STEPS = 200
DEFAULT_BATCHES = 100
DEFAULT_BATCH_SIZE = 64
# --smoke: a few training steps and just past the schedule's last recorded batch (1 + 2 * 5 = 11)
SMOKE_TRAIN_STEPS = 5
SMOKE_BATCHES = 12
SEED = 0


class SmallCNN(nn.Module):
    """Two conv + ReLU + 2x2 max-pool blocks and a linear classifier, for 1x28x28 images."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 28x28 -> 14x14
            nn.Conv2d(16, 32, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 14x14 -> 7x7
        )
        # The classic snippet sizes this layer 32 * 56 * 56, the size for 224x224 inputs; after two 2x2
        # poolings a 28x28 image leaves 32 channels of 7x7.
        self.classifier = nn.Linear(32 * 7 * 7, NUM_CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(images).flatten(1))


class CNNClassifier(L.LightningModule):
    """:class:`SmallCNN` trained with cross-entropy; logs loss, accuracy and (in evaluation) weight histograms.

    Args:
        lr: Adam learning rate.
    """

    def __init__(self, lr: float = 1e-3) -> None:
        super().__init__()
        if not lr > 0:
            raise ValueError(f"`lr` must be > 0, got {lr!r}")
        self.save_hyperparameters()
        self.net = SmallCNN()
        self.example_input_array = torch.zeros(1, *IMAGE_SHAPE)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images)

    def _loss_and_accuracy(
        self, batch: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = batch
        logits = self(images)
        accuracy = (logits.argmax(dim=1) == labels).float().mean()
        return F.cross_entropy(logits, labels), accuracy

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss, accuracy = self._loss_and_accuracy(batch)
        self.log("train_loss", loss, prog_bar=True)
        self.log("train_acc", accuracy)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        loss, accuracy = self._loss_and_accuracy(batch)
        self.log("val_loss", loss, prog_bar=True)
        self.log("val_acc", accuracy, prog_bar=True)

    def on_validation_epoch_end(self) -> None:
        # weight histograms once per evaluation (TensorBoard's Histograms and Distributions tabs)
        if self.trainer.sanity_checking or not isinstance(self.logger, TensorBoardLogger):
            return
        for name, param in self.named_parameters():
            self.logger.experiment.add_histogram(f"weights/{name}", param.detach(), self.global_step)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


class MNISTDataModule(L.LightningDataModule):
    """MNIST, or synthetic 28x28 images shaped like it, normalised with the MNIST mean/std.

    Args:
        data: "synthetic" (torchvision ``FakeData``, offline) or "mnist" (downloaded into ``data_dir``).
        data_dir: where MNIST is downloaded to and read from.
        batch_size: images per batch.
        num_workers: DataLoader worker processes (0 loads in the main process).
        num_samples: images in each synthetic split (training and evaluation).
    """

    def __init__(
        self,
        data: Literal["synthetic", "mnist"] = "synthetic",
        data_dir: str = "data",
        batch_size: int = DEFAULT_BATCH_SIZE,
        num_workers: int = 0,
        num_samples: int = 10_000,
    ) -> None:
        super().__init__()
        if data not in DATA_CHOICES:
            raise ValueError(f"`data` must be one of {list(DATA_CHOICES)}, got {data!r}")
        for name, value, minimum in (("batch_size", batch_size, 1), ("num_workers", num_workers, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"`{name}` must be an integer >= {minimum}, got {value!r}")
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"`num_samples` must be an integer >= 1, got {num_samples!r}")
        # the CLI's `_class_path` stays with the model: Lightning 2.4 refuses two different ones in the logged hparams
        self.save_hyperparameters(ignore="_class_path")
        self.train_set: Dataset | None = None
        self.eval_set: Dataset | None = None

    def prepare_data(self) -> None:
        if self.hparams.data == "mnist":
            for train in (True, False):
                torchvision.datasets.MNIST(self.hparams.data_dir, train=train, download=True)

    def setup(self, stage: str) -> None:
        tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize(MNIST_MEAN, MNIST_STD)])
        if self.hparams.data == "mnist":
            self.train_set = torchvision.datasets.MNIST(self.hparams.data_dir, train=True, transform=tf)
            self.eval_set = torchvision.datasets.MNIST(self.hparams.data_dir, train=False, transform=tf)
        else:
            fake = dict(
                size=self.hparams.num_samples, image_size=IMAGE_SHAPE, num_classes=NUM_CLASSES, transform=tf
            )
            self.train_set = torchvision.datasets.FakeData(**fake)
            self.eval_set = torchvision.datasets.FakeData(random_offset=FAKE_EVAL_OFFSET, **fake)

    def _loader(self, dataset: Dataset | None, train: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError("MNISTDataModule: call setup() before asking for a DataLoader")
        return DataLoader(
            dataset, batch_size=self.hparams.batch_size, shuffle=train, num_workers=self.hparams.num_workers
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.eval_set, train=False)


def log_graph(logger: TensorBoardLogger, model: CNNClassifier) -> None:
    """The model graph (TensorBoard's Graphs tab), traced once from ``example_input_array``."""
    device = next(model.parameters()).device
    with warnings.catch_warnings():
        # add_graph traces with torch.jit.trace, which torch 2.x marks deprecated; the graph is still written
        warnings.filterwarnings("ignore", category=FutureWarning, module="torch.jit")
        logger.experiment.add_graph(model.net, model.example_input_array.to(device))
    logger.experiment.flush()


def describe(summary: RunSummary) -> str:
    """One line of the inference figures PerfCallback measured."""
    timing = summary.timing
    step = timing.step_time_ms.median if timing.step_time_ms is not None else None
    return (
        f"inference: {timing.steps} timed batches, median {format_value(step, 'ms')} per batch, "
        f"data wait {format_value(timing.data_wait_pct, '%')}, "
        f"throughput {format_value(timing.samples_per_sec, 'samples/s')}"
    )


def run(args: argparse.Namespace) -> int:
    L.seed_everything(SEED, verbose=False)
    logger = TensorBoardLogger(save_dir=args.log_dir, name=RUN_NAME)
    datamodule = MNISTDataModule(
        data=args.data,
        data_dir=args.data_dir,
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        num_samples=max(args.train_steps, args.batches) * args.batch_size,
    )
    model = CNNClassifier()
    common = dict(
        accelerator=args.accelerator,
        devices=1,
        logger=logger,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    if args.train_steps:
        trainer = L.Trainer(max_steps=args.train_steps, limit_val_batches=0, log_every_n_steps=1, **common)
        trainer.fit(model, datamodule=datamodule)
    perf = PerfCallback(**SCHEDULE)
    evaluator = L.Trainer(limit_val_batches=args.batches, callbacks=[perf], **common)
    evaluator.validate(model, datamodule=datamodule)
    log_graph(logger, model)
    if perf.last_summary is not None:
        print(describe(perf.last_summary))
    print(f"Logs, traces and perf_summary_validate.json: {logger.log_dir}")
    print(f"Open them in TensorBoard:\n  tensorboard --logdir {os.path.dirname(logger.log_dir)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python examples/cnn_inference.py",
        description="Profile inference of a small MNIST CNN with PerfCallback and log it to TensorBoard.",
    )
    parser.add_argument(
        "--data", choices=DATA_CHOICES, default="synthetic", help="data set (default synthetic)"
    )
    parser.add_argument("--data-dir", default="data", help="where MNIST is downloaded (with --data mnist)")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="images per batch")
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader workers (default 0)")
    parser.add_argument(
        "--train-steps", type=int, help=f"training steps first (default {DEFAULT_TRAIN_STEPS}; 0: none)"
    )
    parser.add_argument("--batches", type=int, help=f"inference batches profiled (default {DEFAULT_BATCHES})")
    parser.add_argument("--accelerator", default="auto", help="Lightning accelerator: auto, cpu, gpu, ...")
    parser.add_argument("--log-dir", default="perf_logs", help="TensorBoard log root (default perf_logs)")
    parser.add_argument(
        "--smoke", action="store_true", help=f"a tiny run ({SMOKE_BATCHES} batches) for tests"
    )
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.train_steps is None:
        args.train_steps = SMOKE_TRAIN_STEPS if args.smoke else DEFAULT_TRAIN_STEPS
    if args.batches is None:
        args.batches = SMOKE_BATCHES if args.smoke else DEFAULT_BATCHES
    for flag, value, minimum in (
        ("--batch-size", args.batch_size, 1),
        ("--batches", args.batches, 1),
        ("--num-workers", args.num_workers, 0),
        ("--train-steps", args.train_steps, 0),
    ):
        if value < minimum:
            parser.error(f"{flag} must be >= {minimum}, got {value}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return run(parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
