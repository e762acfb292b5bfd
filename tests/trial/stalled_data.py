"""A data module whose DataLoader workers stall: each worker loads a few samples, then its ``__getitem__`` sleeps
an hour (a hung network file system), for the Ctrl-C tests of a round stuck in its loader."""

from __future__ import annotations

import os
import time

import torch
from torch.utils.data import DataLoader, Dataset

from tests.helpers import FEATURES, TinyDataModule


class StallingDataset(Dataset):
    """``n`` samples; once the file ``stall_file`` exists, each worker process loads ``stall_after`` more, then
    sleeps ``stall_s`` in every ``__getitem__`` (the test decides when a round stalls). A worker that stalls
    says so first in the file ``STALL_FILE.stalled.PID``."""

    def __init__(self, n: int, stall_file: str, stall_after: int, stall_s: float) -> None:
        self.n, self.stall_file, self.stall_after, self.stall_s = n, stall_file, stall_after, stall_s
        self.loaded = 0  # per worker process: each has its own copy

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        if os.path.exists(self.stall_file):
            self.loaded += 1
        if self.loaded > self.stall_after:
            if self.loaded == self.stall_after + 1:
                open(f"{self.stall_file}.stalled.{os.getpid()}", "w").close()
            time.sleep(self.stall_s)
        generator = torch.Generator().manual_seed(index)
        return torch.randn(FEATURES, generator=generator), torch.randn(1, generator=generator)


class StallingDataModule(TinyDataModule):
    """TinyDataModule whose training loader's workers stall after ``stall_after`` samples each."""

    def __init__(
        self,
        stall_file: str,
        n: int = 400,
        batch_size: int = 4,
        num_workers: int = 2,
        stall_after: int = 4,
        stall_s: float = 3600.0,
    ) -> None:
        super().__init__(n=n, batch_size=batch_size, num_workers=num_workers)
        self.stall_file, self.stall_after, self.stall_s = stall_file, stall_after, stall_s

    def train_dataloader(self) -> DataLoader:
        dataset = StallingDataset(self.n, self.stall_file, self.stall_after, self.stall_s)
        return DataLoader(dataset, batch_size=self.batch_size, num_workers=self.num_workers)
