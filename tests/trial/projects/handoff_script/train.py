"""A plain script whose loader is quick and in memory, batches of 2 with 2 workers: the workers' hand-off of each
batch is the wait, so fewer workers (0) are the fix."""

import lightning.pytorch as pl
import torch
from slowdata import TinyModel
from torch.utils.data import DataLoader, TensorDataset


def main():
    data = TensorDataset(torch.randn(4096, 16), torch.randint(0, 2, (4096,)))
    loader = DataLoader(data, batch_size=2, shuffle=True, num_workers=2)
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(TinyModel(), loader)


if __name__ == "__main__":
    main()
