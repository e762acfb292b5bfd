"""darts: an N-Linear model on darts' own sine series; darts builds the DataLoader and the Trainer.

``python darts_example.py [STEPS [SLEEP_MS [PERF_DIR]]]``
"""

import sys

import numpy as np
from darts.models import NLinearModel
from darts.utils.data.torch_datasets.training_dataset import ShiftedTorchTrainingDataset
from darts.utils.timeseries_generation import sine_timeseries
from sleepy import arguments, sleepy

from lightning_perf import PerfCallback


def main(steps: int, sleep_s: float, perf_dir: str | None = None) -> None:
    sleepy(ShiftedTorchTrainingDataset, sleep_s)
    series = sine_timeseries(length=2000, value_frequency=0.02).astype(np.float32)
    model = NLinearModel(
        input_chunk_length=24,
        output_chunk_length=6,
        batch_size=8,
        n_epochs=1000,
        pl_trainer_kwargs={
            "callbacks": [PerfCallback(dirpath=perf_dir, enable_profiler=False)],
            "max_steps": steps,
            "enable_progress_bar": False,
            "accelerator": "cpu",
        },
    )
    model.fit(series, dataloader_kwargs={"num_workers": 0})


if __name__ == "__main__":
    main(*arguments(sys.argv[1:]))
