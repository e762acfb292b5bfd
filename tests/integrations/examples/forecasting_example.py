"""pytorch-forecasting: N-BEATS on a generated panel in a TimeSeriesDataSet; ``to_dataloader`` builds the loader.

``python forecasting_example.py [STEPS [SLEEP_MS [PERF_DIR]]]``
"""

import sys

import lightning.pytorch as pl
import numpy as np
import pandas as pd
from pytorch_forecasting import NBeats, TimeSeriesDataSet
from sleepy import arguments, sleepy

from lightning_perf import PerfCallback


def main(steps: int, sleep_s: float, perf_dir: str | None = None) -> None:
    sleepy(TimeSeriesDataSet, sleep_s)
    n_series, length = 16, 200
    time_idx = np.tile(np.arange(length), n_series)
    series = np.repeat(np.arange(n_series), length)
    frame = pd.DataFrame(
        {
            "series": series.astype(str),
            "time_idx": time_idx,
            "value": np.sin(time_idx * 0.1 + series).astype(np.float32) + 2.0,
        }
    )
    dataset = TimeSeriesDataSet(
        frame,
        time_idx="time_idx",
        target="value",
        group_ids=["series"],
        max_encoder_length=24,
        max_prediction_length=6,
        time_varying_unknown_reals=["value"],
    )
    loader = dataset.to_dataloader(train=True, batch_size=8, num_workers=0)
    model = NBeats.from_dataset(dataset, widths=[32, 32], backcast_loss_ratio=0.1)
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        enable_progress_bar=False,
        enable_checkpointing=False,
        callbacks=[PerfCallback(dirpath=perf_dir, enable_profiler=False)],
    )
    trainer.fit(model, train_dataloaders=loader)


if __name__ == "__main__":
    main(*arguments(sys.argv[1:]))
