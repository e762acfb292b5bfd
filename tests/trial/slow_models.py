"""A tiny model that stops at a given batch for as long as told: a hung round, for the round time-limit tests."""

from __future__ import annotations

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
