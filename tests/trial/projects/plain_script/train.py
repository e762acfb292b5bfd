"""A plain script: the DataLoader and the Trainer made in code."""

import lightning.pytorch as pl
from slowdata import SleepyDataset, TinyModel
from torch.utils.data import DataLoader


def main():
    loader = DataLoader(SleepyDataset(), batch_size=8, shuffle=True, num_workers=0)
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(TinyModel(), loader)


if __name__ == "__main__":
    main()
