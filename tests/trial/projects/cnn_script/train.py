"""A plain script training a small CNN on in-memory images: the compute is the work, never the loader.

The dataset holds whole batches (``batch_size=None``), so fetching one costs an index, not a collate.
"""

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Batches(Dataset):
    def __init__(self, batches: int = 64, batch_size: int = 32) -> None:
        self.images = torch.randn(batches, batch_size, 3, 16, 16)
        self.labels = torch.randint(0, 10, (batches, batch_size))

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        return self.images[index], self.labels[index]


class SmallCNN(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(16, 10),
        )

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main():
    torch.manual_seed(0)
    loader = DataLoader(Batches(), batch_size=None, shuffle=True)
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(SmallCNN(), loader)


if __name__ == "__main__":
    main()
