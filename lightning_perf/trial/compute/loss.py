"""The training loss of a round, so a change of numerics is seen beside its speed (``tune``/``trial``).

:class:`RoundLoss` keeps the loss ``training_step`` returned at each batch (Lightning passes it to
``on_train_batch_end``), detached and on its device, so no step waits for the device to read it; when the fit
ends it writes their mean, first and last into the round's folder (:data:`~lightning_perf.trial.compute.figures.
LOSS_FILENAME`), read by :mod:`lightning_perf.trial.compute.figures`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

import torch
from lightning.pytorch import Callback

from lightning_perf.atomic_file import atomic_open
from lightning_perf.trial.compute.figures import LOSS_FILENAME


class RoundLoss(Callback):
    def __init__(self) -> None:
        super().__init__()
        self.losses: list[torch.Tensor] = []

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self.losses.append(loss.detach())

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        folder = getattr(trainer, "log_dir", None)
        if not self.losses or not folder or not getattr(trainer, "is_global_zero", True):
            return
        values = torch.stack([loss.float().reshape(()) for loss in self.losses]).cpu().tolist()
        finite = [v for v in values if math.isfinite(v)]
        figures = {
            "steps": len(values),
            "mean": sum(values) / len(values),  # NaN or inf when a step's loss was: it shows
            "first": values[0],
            "last": values[-1],
            "not_finite": len(values) - len(finite),
        }
        os.makedirs(folder, exist_ok=True)
        with atomic_open(os.path.join(folder, LOSS_FILENAME)) as fh:
            json.dump(figures, fh)
