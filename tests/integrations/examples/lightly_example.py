"""lightly: SimCLR (lightly's projection head and NT-Xent loss) on random images, two views a sample; the
project builds the DataLoader, lightly's models train under ``pytorch_lightning``.

``python lightly_example.py [STEPS [SLEEP_MS [PERF_DIR]]]``
"""

import sys

import pytorch_lightning as pl
import torch
from lightly.loss import NTXentLoss
from lightly.models.modules import SimCLRProjectionHead
from sleepy import arguments, sleepy
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_perf import PerfCallback


class RandomImages(Dataset):
    def __init__(self) -> None:
        self.images = torch.rand(4096, 3, 8, 8, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        image = self.images[index]
        return image.flip(-1), image.roll(1, -2)  # two views


class SimCLR(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        # a small backbone: a conv's threads stall on a busy 2-core machine, a small matmul does not
        self.backbone = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 32), nn.ReLU())
        self.projection_head = SimCLRProjectionHead(32, 16, 8)
        self.criterion = NTXentLoss()

    def training_step(self, batch, batch_idx):
        x0, x1 = batch
        z0, z1 = self.projection_head(self.backbone(x0)), self.projection_head(self.backbone(x1))
        return self.criterion(z0, z1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.06)


def main(steps: int, sleep_s: float, perf_dir: str | None = None) -> None:
    sleepy(RandomImages, sleep_s)
    loader = DataLoader(RandomImages(), batch_size=8, shuffle=True, drop_last=True, num_workers=0)
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        enable_progress_bar=False,
        enable_checkpointing=False,
        callbacks=[PerfCallback(dirpath=perf_dir, enable_profiler=False)],
    )
    trainer.fit(SimCLR(), train_dataloaders=loader)


if __name__ == "__main__":
    main(*arguments(sys.argv[1:]))
