"""Memory growth in real fits: a model that keeps its losses with their graph gets `memory_growth`, one that
does not gets none; the series in perf_summary.json pairs each reading with its global step."""

from __future__ import annotations

import json
import os

import torch

from lightning_perf import PerfCallback
from tests.helpers import TinyModel, loader, trainer

# 40 MB kept with the graph of every step's loss. Above glibc's largest mmap threshold (32 MB on 64-bit,
# mallopt(3)), so every one is a fresh mapping: smaller ones may be served from heap holes that earlier tests in
# the same process freed, and process RSS would then not show the leak for a while.
LEAK_FLOATS = 10_000_000
STEPS = 40


class LeakyModel(TinyModel):
    """The classic leak: every step's output is kept with its graph (``self.outputs.append(out)`` to use at the
    epoch's end, instead of ``out.detach()``): the tensor and the autograd graph it drags stay alive."""

    def __init__(self, leak: bool = True) -> None:
        super().__init__()
        self.leak = leak
        self.kept: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        # a big output of the step, attached to the graph (backward frees the graph's saved tensors, not this)
        out = torch.ones(LEAK_FLOATS) * self.layer.weight.sum()
        if self.leak:
            self.kept.append(out)  # should have been out.detach() (or a running aggregate)
        return loss + 1e-9 * out.mean()


def fit(tmp_path, leak: bool):
    callback = PerfCallback(enable_profiler=False, util_interval_s=0.005, probe_num_workers="never")
    L_trainer = trainer(tmp_path, [callback], limit_val_batches=0)
    L_trainer.fit(LeakyModel(leak), loader(n=STEPS * 4, batch_size=4))
    with open(os.path.join(L_trainer.logger.log_dir, "perf_summary.json")) as fh:
        return callback.last_summary, json.load(fh)


def test_a_leaky_fit_gets_memory_growth_with_its_rate_in_the_summary(tmp_path):
    summary, saved = fit(tmp_path, leak=True)
    memory = saved["memory"]
    assert len(memory["steps"]) >= 20 and memory["steps"] == sorted(memory["steps"])
    assert len(memory["process_rss_mb"]) == len(memory["steps"])
    # no GPU here: no GPU series and the reason, never zeros
    assert memory["gpu_allocated_mb"] == [] and memory["gpu_unavailable_reason"] == "no GPU in use"
    assert memory["ram_total_gb"] > 0 and memory["ram_available_gb"] > 0
    found = {f["id"]: f for f in saved["findings"]}
    assert "memory_growth" in found, (saved["findings"], memory["steps"], memory["process_rss_mb"])
    growth = found["memory_growth"]
    assert growth["severity"] in ("high", "medium")  # >= 1 MB a step
    assert growth["title"] == "Host memory grows step after step"
    assert "Process RSS rises" in growth["evidence"] and "loss.detach()" in growth["recommendation"]
    rate = float(growth["evidence"].split("rises ")[1].split(" MB")[0])
    assert 20.0 < rate < 80.0  # 40 MB a step kept (plus the graph's small tensors)
    assert [f.id for f in summary.findings] == [f["id"] for f in saved["findings"]]


def test_the_same_fit_without_the_leak_has_no_memory_growth(tmp_path):
    summary, saved = fit(tmp_path, leak=False)
    assert len(saved["memory"]["steps"]) >= 20
    assert "memory_growth" not in {f["id"] for f in saved["findings"]}, saved["findings"]
