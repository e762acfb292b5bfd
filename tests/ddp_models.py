"""Models and data for the two-process DDP tests (module level: ddp_spawn pickles them)."""

import time

import lightning as L
import torch
from torch.utils.data import Dataset

from tests.helpers import FEATURES, TinyModel


def rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


class RankSlowedDataset(Dataset):
    """Sleeps ``delay_s`` per sample on ``slow_rank`` only: a straggling input pipeline on one rank."""

    def __init__(self, n: int = 96, slow_rank: int | None = None, delay_s: float = 0.0, lengths=None) -> None:
        self.n = n
        self.slow_rank = slow_rank
        self.delay_s = delay_s
        self.lengths = lengths  # per-rank lengths: uneven batch counts

    def __len__(self) -> int:
        return self.lengths[rank()] if self.lengths else self.n

    def __getitem__(self, index: int):
        if rank() == self.slow_rank:
            time.sleep(self.delay_s)
        return torch.randn(FEATURES), torch.randn(1)


class FailingOnRank(TinyModel):
    def __init__(self, failing_rank: int = 1, at_batch: int = 6) -> None:
        super().__init__()
        self.failing_rank = failing_rank
        self.at_batch = at_batch

    def training_step(self, batch, batch_idx):
        if rank() == self.failing_rank and batch_idx >= self.at_batch:
            raise RuntimeError(f"injected failure on rank {self.failing_rank}")
        return super().training_step(batch, batch_idx)


class NoGradientSync(L.LightningModule):
    """No backward at all, so DDP never synchronises: ranks may run different numbers of batches."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.layer = torch.nn.Linear(FEATURES, 1)

    def training_step(self, batch, batch_idx):
        return None

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)
