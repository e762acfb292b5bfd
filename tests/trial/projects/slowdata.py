"""The model and data of the tune test projects: storage that waits 4 ms a sample, a tiny model.

Copied into each project's folder by tests/trial/test_tune_any_project.py (the projects import it as their own).
"""

import time

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

DELAY_S = 0.004  # a sample's read: the loading waits (a sleep), it does not compute


class SleepyDataset(Dataset):
    def __init__(self, size: int = 100_000, dim: int = 16) -> None:
        self.size, self.dim = size, dim

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        time.sleep(DELAY_S)
        generator = torch.Generator().manual_seed(index)
        return torch.randn(self.dim, generator=generator), torch.tensor(index % 2)


class TinyModel(pl.LightningModule):
    def __init__(self, lr: float = 0.01, batch_size: int = 8) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(16, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class SleepyData(pl.LightningDataModule):
    def __init__(self, batch_size: int = 8, num_workers: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()

    def train_dataloader(self):
        return DataLoader(
            SleepyDataset(),
            batch_size=self.hparams.batch_size,
            shuffle=True,
            num_workers=self.hparams.num_workers,
        )


class WorkersData(pl.LightningDataModule):
    """Like Lightning's ImageNet example: the loader's worker count is an argument called ``workers``."""

    def __init__(self, batch_size: int = 8, workers: int = 0) -> None:
        super().__init__()
        self.batch_size, self.workers = batch_size, workers

    def train_dataloader(self):
        return DataLoader(SleepyDataset(), batch_size=self.batch_size, shuffle=True, num_workers=self.workers)
