"""ResNet-18 on CIFAR10-shaped data: the model and data of lightning-perf's case study.

The case study (synthetic data, runs offline; ``examples/case_study.py`` holds it)::

    python examples/resnet18_cifar10.py

runs ``lightning-perf tune`` (its Python API) on this example's Lightning CLI config, as a user would on their
project: a diagnosis fit with ``PerfCallback``, the findings' changes as candidates (config settings, and the
``batched_transforms`` recipe, which this example switches on by its ``batched_transforms`` arguments: uint8
data, augmentation once per batch on the device in ``on_after_batch_transfer``), measured in interleaved rounds;
the tuned config is written in the log dir and the verdict printed with its interval. ``--data cifar10 --data-dir DIR`` uses the
real data set (downloaded).

The same model and data as a Lightning CLI (``fit``, ``validate``, ``test``, ``predict``)::

    python examples/resnet18_cifar10.py fit --config examples/config.yaml

What a user runs on their own project, here on this one (``lightning-perf tune`` on ``examples/config.yaml``;
any ``tune`` flag after ``tune``; writes ``examples/config.tuned.yaml`` when a change is verified faster)::

    python examples/resnet18_cifar10.py tune --steps 20 --budget-s 900
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
import torchvision
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torchvision import transforms

if __package__ in (
    None,
    "",
):  # run as a script (python examples/resnet18_cifar10.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.batch_augment import augment_batch, normalize_batch  # noqa: E402

NUM_CLASSES = 10
IMAGE_SHAPE = (3, 32, 32)
# per-channel mean and standard deviation of the CIFAR10 training images (the values torchvision users quote)
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
# torchvision's usual CIFAR10 augmentation: RandomCrop(32, padding=4)
CROP_PADDING = 4
CIFAR10_TRAIN_SIZE = 50_000
CIFAR10_TEST_SIZE = 10_000
# FakeData seeds each image from its index plus this offset: keeps validation images apart from training ones
FAKE_VAL_OFFSET = 1_000_000
DATA_CHOICES = ("synthetic", "cifar10")

SEED = 0

# Lightning warns whenever a model overriding a batch-transfer hook is fitted with a DataModule (data_connector);
# this example means it: the model augments on the device, the DataModule keeps the default hook.
warnings.filterwarnings("ignore", message=r".*overridden `on_after_batch_transfer` in `LightningModule`.*")

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
        batched_transforms: the batches arrive as uint8 images (``CIFAR10DataModule(batched_transforms=True)``)
            and are augmented (training) and normalized here, once per batch on the device, in
            ``on_after_batch_transfer``: the recipe of lightning-perf's ``batched_transforms`` finding.
    """

    def __init__(
        self,
        lr: float = 0.05,
        momentum: float = 0.9,
        weight_decay: float = 5e-4,
        cifar_stem: bool = False,
        batched_transforms: bool = False,
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
        # not saved in checkpoints: constants that follow the module to its device
        self.register_buffer("pixel_mean", torch.tensor(CIFAR10_MEAN), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(CIFAR10_STD), persistent=False)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if not self.hparams.batched_transforms:
            return batch
        images, labels = batch
        if images.dtype != torch.uint8:
            raise ValueError(
                "ResNet18Classifier(batched_transforms=True) expects uint8 images "
                f"(CIFAR10DataModule(batched_transforms=True)), got {images.dtype}"
            )
        if self.training:  # Lightning puts the module in train mode for training batches only
            return augment_batch(images, self.pixel_mean, self.pixel_std, padding=CROP_PADDING), labels
        return normalize_batch(images, self.pixel_mean, self.pixel_std), labels

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

    Per sample (the default): training images get a random 32x32 crop of the 4-pixel padded image and a
    random horizontal flip, then ``ToTensor`` and ``Normalize`` with the CIFAR10 mean/std; validation images
    only the last two. Both kinds of data go through the same PIL pipeline; the synthetic images are
    torchvision's ``FakeData``, generated per access like an image decoded from storage.

    With ``batched_transforms=True`` the data set is held as uint8 tensors (CIFAR10's own array; the synthetic
    images generated once) and batches leave the DataLoader as uint8 images: ``ResNet18Classifier(
    batched_transforms=True)`` augments and normalizes them on the device, once per batch.

    Args:
        data: "synthetic" (offline) or "cifar10" (downloaded into ``data_dir``).
        data_dir: where CIFAR10 is downloaded to and read from.
        batch_size: images per batch.
        num_workers: DataLoader worker processes (0 loads in the training process).
        pin_memory: DataLoader ``pin_memory`` (faster host-to-GPU copies).
        persistent_workers: keep workers alive between epochs (needs ``num_workers > 0``).
        prefetch_factor: batches each worker loads ahead (needs ``num_workers > 0``; None: torch's default).
        num_samples: training images of the synthetic data (validation gets a fifth as many, as CIFAR10 does).
        batched_transforms: yield uint8 images and leave augmentation to the model (see above).
    """

    def __init__(
        self,
        data: Literal["synthetic", "cifar10"] = "synthetic",
        data_dir: str = "data",
        batch_size: int = 64,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
        num_samples: int = CIFAR10_TRAIN_SIZE,
        batched_transforms: bool = False,
    ) -> None:
        super().__init__()
        if data not in DATA_CHOICES:
            raise ValueError(f"`data` must be one of {list(DATA_CHOICES)}, got {data!r}")
        _check_int("batch_size", batch_size, minimum=1)
        _check_int("num_workers", num_workers, minimum=0)
        _check_int("num_samples", num_samples, minimum=1)
        if persistent_workers and num_workers == 0:
            raise ValueError("`persistent_workers=True` needs `num_workers` > 0, got num_workers=0")
        if prefetch_factor is not None:
            _check_int("prefetch_factor", prefetch_factor, minimum=1)
            if num_workers == 0:
                raise ValueError(
                    f"`prefetch_factor={prefetch_factor}` needs `num_workers` > 0, got num_workers=0"
                )
        # the CLI's `_class_path` stays with the model: Lightning 2.4 refuses two different ones in the logged hparams
        self.save_hyperparameters(ignore="_class_path")
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None

    def prepare_data(self) -> None:
        if self.hparams.data == "cifar10":
            for train in (True, False):
                torchvision.datasets.CIFAR10(self.hparams.data_dir, train=train, download=True)

    def setup(self, stage: str) -> None:
        if self.hparams.batched_transforms:
            self.train_set, self.val_set = self._uint8_sets()
            return
        normalize = [transforms.ToTensor(), transforms.Normalize(CIFAR10_MEAN, CIFAR10_STD)]
        augment = [
            transforms.RandomCrop(IMAGE_SHAPE[1], padding=CROP_PADDING),
            transforms.RandomHorizontalFlip(),
        ]
        train_tf = transforms.Compose(augment + normalize)
        val_tf = transforms.Compose(normalize)
        if self.hparams.data == "cifar10":
            root = self.hparams.data_dir
            self.train_set = torchvision.datasets.CIFAR10(root, train=True, transform=train_tf)
            self.val_set = torchvision.datasets.CIFAR10(root, train=False, transform=val_tf)
        else:
            fake = dict(image_size=IMAGE_SHAPE, num_classes=NUM_CLASSES)
            self.train_set = torchvision.datasets.FakeData(
                size=self.hparams.num_samples, transform=train_tf, **fake
            )
            self.val_set = torchvision.datasets.FakeData(
                size=self._val_size(), transform=val_tf, random_offset=FAKE_VAL_OFFSET, **fake
            )

    def _val_size(self) -> int:
        return max(1, self.hparams.num_samples * CIFAR10_TEST_SIZE // CIFAR10_TRAIN_SIZE)

    def _uint8_sets(self) -> tuple[Dataset, Dataset]:
        """Training and validation sets of uint8 (N, 3, 32, 32) images and int64 labels, held in memory."""
        if self.hparams.data == "cifar10":
            root = self.hparams.data_dir
            sets = [torchvision.datasets.CIFAR10(root, train=train) for train in (True, False)]
            # CIFAR10 keeps its images as one uint8 (N, 32, 32, 3) array: channels first, no copy per sample
            return tuple(
                TensorDataset(
                    torch.from_numpy(d.data).permute(0, 3, 1, 2).contiguous(), torch.tensor(d.targets)
                )
                for d in sets
            )
        return (
            TensorDataset(*synthetic_uint8(self.hparams.num_samples, SEED)),
            TensorDataset(*synthetic_uint8(self._val_size(), SEED + FAKE_VAL_OFFSET)),
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
            prefetch_factor=self.hparams.prefetch_factor,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, train=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, train=False)


@functools.lru_cache(maxsize=4)
def synthetic_uint8(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` random uint8 CIFAR10-shaped images and labels, drawn once (a few MB per thousand images)."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (count, *IMAGE_SHAPE), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, NUM_CLASSES, (count,), generator=generator)
    return images, labels


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}, got {value!r}")


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
    if given and given[0] == "tune":  # the closed loop as a user runs it: diagnose, measure, write the config
        from lightning_perf.cli import main as lightning_perf_main

        root = str(Path(__file__).resolve().parents[1])  # the workers import the config's examples.* classes
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))

        return lightning_perf_main(["tune", "--config", os.path.relpath(CONFIG_PATH), *given[1:]])
    from examples.case_study import parse_study_args, run_study

    return run_study(parse_study_args(given))


if __name__ == "__main__":
    # Run as a script, this file is `__main__`; run the importable module instead, so that the classes are
    # `examples.resnet18_cifar10.*`, the class paths the config names (and DataLoader workers can import).
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from examples.resnet18_cifar10 import main as _main

    sys.exit(_main())
