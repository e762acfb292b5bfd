"""ResNet-18 on CIFAR10-shaped data: the DataLoader case study for lightning-perf.

The case study (synthetic data, runs offline; a GPU user adds ``--accelerator gpu --steps 500 ...``)::

    python examples/resnet18_cifar10.py

trains twice with ``PerfCallback``: "before" (``num_workers=0``, cudnn.benchmark off) and "after"
(``num_workers`` chosen for the machine, cudnn.benchmark on), prints the before/after table and the command
that opens both runs in TensorBoard. ``--data cifar10 --data-dir DIR`` uses the real data set (downloaded).

The same model and data as a Lightning CLI (``fit``, ``validate``, ``test``, ``predict``)::

    python examples/resnet18_cifar10.py fit --config examples/config.yaml
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
import torchvision
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

from lightning_perf import PerfCallback
from lightning_perf.analysis.comparison import compare
from lightning_perf.analysis.comparison_render import render_text
from lightning_perf.analysis.summary import RunSummary
from lightning_perf.collect.utilization import usable_cpu_count

NUM_CLASSES = 10
IMAGE_SHAPE = (3, 32, 32)
# per-channel mean and standard deviation of the CIFAR10 training images (the values torchvision users quote)
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR10_TRAIN_SIZE = 50_000
CIFAR10_TEST_SIZE = 10_000
# FakeData seeds each image from its index plus this offset: keeps validation images apart from training ones
FAKE_VAL_OFFSET = 1_000_000
DATA_CHOICES = ("synthetic", "cifar10")

STUDY_NAME = "resnet18_cifar10"
# the profiling schedule of the issue: two cycles of 3 recorded steps, after 1 skipped, 1 idle and 1 warm-up
STUDY_SCHEDULE = dict(skip_first=1, wait=1, warmup=1, active=3, repeat=2)
# Default size, tuned on a 2-core CPU with no GPU: a step of 64 images there takes ~100 ms of compute plus
# ~37 ms of FakeData + transforms + collate in the training process (a 27% data wait with num_workers=0), and
# the whole study (two runs, start-up included) about a minute when nothing else runs there.
DEFAULT_STEPS = 200
DEFAULT_BATCH_SIZE = 64
# --smoke: just past the schedule's last recorded step (1 + 2 * (1 + 1 + 3) = 11 batches), tiny batches
SMOKE_STEPS = 12
SMOKE_BATCH_SIZE = 8
SMOKE_NUM_SAMPLES = 256
# at most this many workers for 'after', a common starting point (more workers than usable cores only compete
# for them); a fast GPU may need more: --workers N, and the 'before' run's num_workers probe measures it
MAX_AUTO_WORKERS = 4
LOG_EVERY_N_STEPS = 10
SEED = 0

CLI_SUBCOMMANDS = ("fit", "validate", "test", "predict")
CONFIG_PATH = Path(__file__).with_name("config.yaml")


class ResNet18Classifier(L.LightningModule):
    """torchvision's ResNet-18 (10 classes, random initial weights) trained with cross-entropy and SGD.

    Args:
        lr: SGD learning rate.
        momentum: SGD momentum.
        weight_decay: L2 penalty.
        cifar_stem: replace the ImageNet stem (7x7 stride-2 conv + max-pool, which shrinks 32x32 inputs to 8x8)
            by the usual CIFAR stem (3x3 stride-1 conv, no max-pool): more accurate, ~16x the compute per image.
    """

    def __init__(
        self, lr: float = 0.05, momentum: float = 0.9, weight_decay: float = 5e-4, cifar_stem: bool = False
    ) -> None:
        super().__init__()
        if not lr > 0:
            raise ValueError(f"`lr` must be > 0, got {lr!r}")
        if not 0 <= momentum < 1:
            raise ValueError(f"`momentum` must be in [0, 1), got {momentum!r}")
        if weight_decay < 0:
            raise ValueError(f"`weight_decay` must be >= 0, got {weight_decay!r}")
        self.save_hyperparameters()
        self.model = torchvision.models.resnet18(weights=None, num_classes=NUM_CLASSES)
        if cifar_stem:
            # The common CIFAR adaptation keeps the 32x32 resolution through the first stage. Off by default:
            # the ImageNet stem keeps a CPU step cheap enough that the DataLoader's share stays visible.
            self.model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
            self.model.maxpool = nn.Identity()
        self.example_input_array = torch.zeros(1, *IMAGE_SHAPE)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model(images)

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
        self.log("val_acc", accuracy)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        loss, accuracy = self._loss_and_accuracy(batch)
        self.log("test_loss", loss)
        self.log("test_acc", accuracy)

    def predict_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self(batch[0]).argmax(dim=1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(
            self.parameters(),
            lr=self.hparams.lr,
            momentum=self.hparams.momentum,
            weight_decay=self.hparams.weight_decay,
        )


class CIFAR10DataModule(L.LightningDataModule):
    """CIFAR10, or synthetic images shaped like it, with the usual CIFAR10 augmentation.

    Training images get a random 32x32 crop of the 4-pixel padded image and a random horizontal flip, then
    ``ToTensor`` and ``Normalize`` with the CIFAR10 mean/std; validation images only the last two. Both kinds
    of data go through the same PIL pipeline, so the synthetic data costs the DataLoader what CIFAR10 does.

    Args:
        data: "synthetic" (torchvision ``FakeData``, offline) or "cifar10" (downloaded into ``data_dir``).
        data_dir: where CIFAR10 is downloaded to and read from.
        batch_size: images per batch.
        num_workers: DataLoader worker processes (0 loads in the training process).
        pin_memory: DataLoader ``pin_memory`` (faster host-to-GPU copies).
        persistent_workers: keep workers alive between epochs (needs ``num_workers > 0``).
        num_samples: training images of the synthetic data (validation gets a fifth as many, as CIFAR10 does).
    """

    def __init__(
        self,
        data: Literal["synthetic", "cifar10"] = "synthetic",
        data_dir: str = "data",
        batch_size: int = 64,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        num_samples: int = CIFAR10_TRAIN_SIZE,
    ) -> None:
        super().__init__()
        if data not in DATA_CHOICES:
            raise ValueError(f"`data` must be one of {list(DATA_CHOICES)}, got {data!r}")
        _check_int("batch_size", batch_size, minimum=1)
        _check_int("num_workers", num_workers, minimum=0)
        _check_int("num_samples", num_samples, minimum=1)
        if persistent_workers and num_workers == 0:
            raise ValueError("`persistent_workers=True` needs `num_workers` > 0, got num_workers=0")
        self.save_hyperparameters()
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None

    def prepare_data(self) -> None:
        if self.hparams.data == "cifar10":
            for train in (True, False):
                torchvision.datasets.CIFAR10(self.hparams.data_dir, train=train, download=True)

    def setup(self, stage: str) -> None:
        normalize = [transforms.ToTensor(), transforms.Normalize(CIFAR10_MEAN, CIFAR10_STD)]
        augment = [transforms.RandomCrop(IMAGE_SHAPE[1], padding=4), transforms.RandomHorizontalFlip()]
        train_tf = transforms.Compose(augment + normalize)
        val_tf = transforms.Compose(normalize)
        if self.hparams.data == "cifar10":
            root = self.hparams.data_dir
            self.train_set = torchvision.datasets.CIFAR10(root, train=True, transform=train_tf)
            self.val_set = torchvision.datasets.CIFAR10(root, train=False, transform=val_tf)
        else:
            n = self.hparams.num_samples
            val_n = max(1, n * CIFAR10_TEST_SIZE // CIFAR10_TRAIN_SIZE)
            fake = dict(image_size=IMAGE_SHAPE, num_classes=NUM_CLASSES)
            self.train_set = torchvision.datasets.FakeData(size=n, transform=train_tf, **fake)
            self.val_set = torchvision.datasets.FakeData(
                size=val_n, transform=val_tf, random_offset=FAKE_VAL_OFFSET, **fake
            )

    def _loader(self, dataset: Dataset | None, train: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError("CIFAR10DataModule: call setup() before asking for a DataLoader")
        return DataLoader(
            dataset,
            batch_size=self.hparams.batch_size,
            shuffle=train,
            drop_last=train,
            num_workers=self.hparams.num_workers,
            pin_memory=self.hparams.pin_memory,
            persistent_workers=self.hparams.persistent_workers,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, train=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, train=False)


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}, got {value!r}")


# ------------------------------------------------------------------------------------------ the case study


@dataclass(frozen=True)
class Variant:
    name: str
    num_workers: int
    cudnn_benchmark: bool


def auto_num_workers() -> int:
    """Workers for 'after': one per usable core (the affinity mask, not the machine), at most MAX_AUTO_WORKERS."""
    return max(1, min(MAX_AUTO_WORKERS, usable_cpu_count()))


def run_variant(args: argparse.Namespace, variant: Variant) -> RunSummary:
    """Train once with PerfCallback, logged as the TensorBoard run ``<log_dir>/resnet18_cifar10/<name>``."""
    logger = TensorBoardLogger(save_dir=args.log_dir, name=STUDY_NAME, version=variant.name)
    if os.path.isdir(logger.log_dir) and rank_zero_only.rank == 0:
        # a rerun replaces the run, so TensorBoard and the profiler tab never mix two runs' files (rank zero
        # only: with --devices > 1 the other ranks start later, into the run rank zero already began)
        print(f"replacing the previous run in {logger.log_dir}")
        shutil.rmtree(logger.log_dir)
    L.seed_everything(SEED, verbose=False)  # the same initial weights and images for both variants
    datamodule = CIFAR10DataModule(
        data=args.data,
        data_dir=args.data_dir,
        batch_size=args.batch_size,
        num_workers=variant.num_workers,
        num_samples=SMOKE_NUM_SAMPLES if args.smoke else CIFAR10_TRAIN_SIZE,
    )
    perf = PerfCallback(**STUDY_SCHEDULE)
    trainer = L.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        max_steps=args.steps,
        benchmark=variant.cudnn_benchmark,  # how Lightning users set torch.backends.cudnn.benchmark
        logger=logger,
        callbacks=[perf],
        log_every_n_steps=min(LOG_EVERY_N_STEPS, args.steps),
        # the study measures training only: no validation, checkpoints or model summary in the way
        limit_val_batches=0,
        num_sanity_val_steps=0,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(ResNet18Classifier(cifar_stem=args.cifar_stem), datamodule=datamodule)
    if perf.last_summary is None:
        raise RuntimeError(f"the {variant.name!r} run finished without a performance summary")
    return perf.last_summary


def run_study(args: argparse.Namespace) -> int:
    if args.workers is None:
        workers = auto_num_workers()
        why = f"min({MAX_AUTO_WORKERS}, {usable_cpu_count()} usable cores)"
    else:
        workers, why = args.workers, "--workers"
    variants = [Variant("before", 0, False), Variant("after", workers, True)]
    print(
        f"Case study: ResNet-18 on {args.data} CIFAR10-shaped data, {args.steps} steps of {args.batch_size} "
        f"images per run.\n  before: num_workers=0, cudnn.benchmark off\n"
        f"  after:  num_workers={workers} ({why}), cudnn.benchmark on\n",
        flush=True,
    )
    benchmark_was = torch.backends.cudnn.benchmark
    try:
        summaries = [run_variant(args, variant) for variant in variants]
    finally:
        torch.backends.cudnn.benchmark = benchmark_was  # Trainer(benchmark=...) sets it process-wide
    if rank_zero_only.rank != 0:
        return 0
    comparison = compare(summaries, [v.name for v in variants])
    runs_dir = os.path.join(args.log_dir, STUDY_NAME)
    print()
    print(render_text(comparison))
    print(
        f"Open both runs in TensorBoard (Scalars, Text, PyTorch Profiler tabs):\n  tensorboard --logdir {runs_dir}"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python examples/resnet18_cifar10.py",
        description=(
            "Run the ResNet-18 DataLoader case study (before/after with PerfCallback). Give a Lightning CLI "
            f"subcommand ({', '.join(CLI_SUBCOMMANDS)}) instead to train with LightningCLI, e.g. "
            "`fit --config examples/config.yaml`."
        ),
    )
    parser.add_argument("command", nargs="?", choices=["study"], default="study", help="the case study")
    parser.add_argument("--steps", type=int, help=f"training steps per run (default {DEFAULT_STEPS})")
    parser.add_argument("--batch-size", type=int, help=f"images per batch (default {DEFAULT_BATCH_SIZE})")
    parser.add_argument(
        "--workers", type=int, help="num_workers of 'after' (default: chosen for the machine)"
    )
    parser.add_argument("--accelerator", default="auto", help="Lightning accelerator: auto, cpu, gpu, ...")
    parser.add_argument("--devices", type=int, default=1, help="devices to train on (default 1)")
    parser.add_argument(
        "--data", choices=DATA_CHOICES, default="synthetic", help="data set (default synthetic)"
    )
    parser.add_argument(
        "--data-dir", default="data", help="where CIFAR10 is downloaded (with --data cifar10)"
    )
    parser.add_argument("--log-dir", default="perf_logs", help="TensorBoard log root (default perf_logs)")
    parser.add_argument("--cifar-stem", action="store_true", help="3x3 stem without max-pool (16x compute)")
    parser.add_argument("--smoke", action="store_true", help=f"a tiny run ({SMOKE_STEPS} steps) for tests")
    return parser


def parse_study_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = SMOKE_STEPS if args.smoke else DEFAULT_STEPS
    if args.batch_size is None:
        args.batch_size = SMOKE_BATCH_SIZE if args.smoke else DEFAULT_BATCH_SIZE
    for flag, value in (
        ("--steps", args.steps),
        ("--batch-size", args.batch_size),
        ("--devices", args.devices),
        ("--workers", args.workers),
    ):
        if value is not None and value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    return args


def run_cli(argv: Sequence[str] | None) -> None:
    """Hand over to LightningCLI; examples/config.yaml is the default config of every subcommand."""
    from lightning.pytorch.cli import LightningCLI

    LightningCLI(
        ResNet18Classifier,
        CIFAR10DataModule,
        # class_path entries in the config, as plain `LightningCLI()` (and `lightning-perf trial`) read them
        subclass_mode_model=True,
        subclass_mode_data=True,
        parser_kwargs={cmd: {"default_config_files": [str(CONFIG_PATH)]} for cmd in CLI_SUBCOMMANDS},
        # reruns into the same log dir (e.g. a named logger version) must not abort on the saved config
        save_config_kwargs={"overwrite": True},
        args=None if argv is None else list(argv),  # None: LightningCLI reads sys.argv itself
    )


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if given and given[0] in CLI_SUBCOMMANDS:
        run_cli(argv)
        return 0
    return run_study(parse_study_args(given))


if __name__ == "__main__":
    # Run as a script, this file is `__main__`; run the importable module instead, so that the classes are
    # `examples.resnet18_cifar10.*`, the class paths the config names (and DataLoader workers can import).
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from examples.resnet18_cifar10 import main as _main

    sys.exit(_main())
