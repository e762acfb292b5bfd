"""neuralforecast: an MLP on a generated panel (``AIR=1``: the AirPassengers series it ships); neuralforecast
builds the DataLoader (whole series a batch) and the Trainer, and samples its windows inside ``training_step``.

``python neuralforecast_example.py [STEPS [SLEEP_MS [PERF_DIR]]]``
"""

import os
import sys

from neuralforecast import NeuralForecast
from neuralforecast.models import MLP
from neuralforecast.tsdataset import TimeSeriesDataset
from neuralforecast.utils import AirPassengersDF, generate_series
from sleepy import arguments, sleepy

from lightning_perf import PerfCallback


def main(steps: int, sleep_s: float, perf_dir: str | None = None) -> None:
    sleepy(TimeSeriesDataset, sleep_s)
    if os.environ.get("AIR") == "1":  # one series: one batch an epoch
        frame, freq = AirPassengersDF, "ME"
    else:
        frame, freq = generate_series(n_series=64, min_length=120, max_length=120, seed=0), "D"
    model = MLP(
        h=6,
        input_size=24,
        hidden_size=32,
        num_layers=1,
        batch_size=8,
        windows_batch_size=64,
        max_steps=steps,
        val_check_steps=10_000,
        dataloader_kwargs={"num_workers": 0},
        callbacks=[PerfCallback(dirpath=perf_dir, enable_profiler=False)],
        enable_progress_bar=False,
        accelerator="cpu",
    )
    NeuralForecast(models=[model], freq=freq).fit(df=frame)


if __name__ == "__main__":
    main(*arguments(sys.argv[1:]))
