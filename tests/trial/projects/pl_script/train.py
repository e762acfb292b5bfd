"""A plain script on the standalone `pytorch_lightning` package, saving checkpoints into the project."""

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from slowdata import SleepyDataset
from torch.utils.data import DataLoader


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(16, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main():
    loader = DataLoader(SleepyDataset(), batch_size=8, shuffle=True, num_workers=0)
    checkpoints = ModelCheckpoint(dirpath="checkpoints", every_n_train_steps=1)
    trainer = pl.Trainer(max_epochs=1, logger=False, callbacks=[checkpoints], enable_progress_bar=False)
    trainer.fit(Tiny(), loader)


if __name__ == "__main__":
    main()
