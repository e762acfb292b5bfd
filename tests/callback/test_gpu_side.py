"""The callback's GPU-side wiring in a real fit: utilization kept over steps only, no batch kept for the A/B."""

from __future__ import annotations

import torch

from lightning_perf import PerfCallback
from tests.helpers import TinyModel, loader, trainer


class Watching(TinyModel):
    """Notes whether the callback's sampler was paused in each kind of step."""

    def __init__(self, callback: PerfCallback) -> None:
        super().__init__()
        self.callback = callback
        self.paused: dict[str, set[bool]] = {"train": set(), "validation": set()}

    def training_step(self, batch, batch_idx):
        self.paused["train"].add(self.callback._sampler.paused)
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        if self.callback._sampler is not None:  # not in the sanity check, before training starts
            self.paused["validation"].add(self.callback._sampler.paused)
        return super().validation_step(batch, batch_idx)


def test_utilization_is_paused_outside_training_steps_and_only_a_batch_spec_is_kept(tmp_path):
    callback = PerfCallback(enable_profiler=False, probe_num_workers="never", util_interval_s=0.05)
    model = Watching(callback)
    fit = trainer(tmp_path, [callback], max_epochs=2, limit_val_batches=2, num_sanity_val_steps=2)
    fit.fit(model, loader(n=24), loader(n=8))
    assert model.paused == {"train": {False}, "validation": {True}}
    assert callback._ab_spec is None  # reset once the run ended
    assert all(not isinstance(v, torch.Tensor) for v in vars(callback).values())


def test_the_ab_keeps_a_spec_not_the_batch_during_the_run(tmp_path):
    seen = []

    class Peek(TinyModel):
        def __init__(self, callback):
            super().__init__()
            self.callback = callback

        def training_step(self, batch, batch_idx):
            seen.append(self.callback._ab_spec)
            return super().training_step(batch, batch_idx)

    callback = PerfCallback(enable_profiler=False, utilization=False, probe_num_workers="never")
    trainer(tmp_path, [callback]).fit(Peek(callback), loader(n=12))
    from lightning_perf.probes.cudnn_benchmark import BatchSpec

    assert seen and all(isinstance(spec, BatchSpec) for spec in seen)
    assert seen[0].shape[0] == 4 and seen[0].dtype == torch.float32
