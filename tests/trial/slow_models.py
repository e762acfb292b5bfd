"""Tiny models that stop when told: a hung round, for the round time-limit and Ctrl-C tests."""

from __future__ import annotations

import os
import time

from tests.helpers import TinyModel


class SleepAtBatch(TinyModel):
    """TinyModel whose ``training_step`` sleeps ``sleep_s`` (an hour by default) at batch ``sleep_at_batch``
    (counted from 1 over the whole fit; None: never)."""

    def __init__(
        self, sleep_at_batch: int | None = None, sleep_s: float = 3600.0, step_delay_s: float = 0.0
    ) -> None:
        super().__init__(step_delay_s=step_delay_s)
        self.sleep_at_batch = sleep_at_batch
        self.sleep_s = sleep_s

    def training_step(self, batch, batch_idx):
        if self.sleep_at_batch is not None and self.seen_batches + 1 == self.sleep_at_batch:
            time.sleep(self.sleep_s)
        return super().training_step(batch, batch_idx)


class HangsWhenTold(TinyModel):
    """TinyModel whose ``training_step`` sleeps an hour once the file ``hang_file`` exists: the test decides when a
    round hangs (a Ctrl-C then lands inside a round however fast the rounds before it ran)."""

    def __init__(self, hang_file: str, step_delay_s: float = 0.0) -> None:
        super().__init__(step_delay_s=step_delay_s)
        self.hang_file = hang_file

    def training_step(self, batch, batch_idx):
        if os.path.exists(self.hang_file):
            time.sleep(3600.0)
        return super().training_step(batch, batch_idx)
