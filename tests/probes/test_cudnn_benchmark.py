"""The cudnn.benchmark A/B: times what training ran, leaves everything as it found it, and never deadlocks."""

from __future__ import annotations

import gc
import os
import weakref

import lightning as L
import pytest
import torch
from lightning.pytorch.plugins.precision import HalfPrecision, MixedPrecision
from torch.utils.data import DataLoader, TensorDataset

from lightning_perf import PerfCallback
from lightning_perf.analysis.summary import RunSummary
from lightning_perf.probes import cudnn_benchmark as probe
from tests.helpers import trainer


def conv_net(dropout: float = 0.0):
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.Dropout(dropout),
        torch.nn.Flatten(),
        torch.nn.LazyLinear(2),
    )


def spec_of(*shape, dtype=torch.float32):
    return probe.BatchSpec(shape, dtype)


def test_runs_both_ways_and_restores_flag_buffers_grads_and_rng():
    model = conv_net(dropout=0.5)
    model(torch.randn(2, 3, 8, 8))  # materialise the lazy layer
    model.eval()
    for param in model.parameters():
        param.grad = torch.full_like(param, 7.0)  # the last training step's gradients
    seen_grads = []
    model[0].register_forward_hook(lambda m, i, o: seen_grads.append(m.weight.grad))
    buffers = [b.clone() for b in model.buffers()]
    rng = torch.random.get_rng_state()
    before = torch.backends.cudnn.benchmark
    result = probe.cudnn_benchmark_ab(model, spec_of(2, 3, 8, 8), torch.device("cpu"), force=True)
    assert result.applies is True
    assert result.off_ms > 0 and result.on_ms > 0
    assert result.speedup == result.off_ms / result.on_ms
    assert torch.backends.cudnn.benchmark is before
    assert not model.training  # mode restored
    assert all(torch.equal(a, b) for a, b in zip(buffers, model.buffers(), strict=True))
    assert torch.equal(torch.random.get_rng_state(), rng)  # dropout and the random input used a forked RNG
    assert seen_grads and all(grad is None for grad in seen_grads)  # set aside during the passes
    assert all(torch.equal(p.grad, torch.full_like(p, 7.0)) for p in model.parameters())  # and put back


def test_says_why_it_does_not_apply():
    model = conv_net()
    assert "cpu" in probe.cudnn_benchmark_ab(model, spec_of(1, 3, 8, 8), torch.device("cpu")).reason
    linear = torch.nn.Linear(3, 1)
    assert (
        probe.cudnn_benchmark_ab(linear, spec_of(1, 3), torch.device("cuda")).reason
        == "the model has no convolutions"
    )
    assert probe.cudnn_benchmark_ab(model, None, torch.device("cuda")).applies is False


def test_a_forward_that_rejects_the_batch_is_reported_not_raised():
    model = conv_net()
    before = torch.backends.cudnn.benchmark
    result = probe.cudnn_benchmark_ab(model, spec_of(2, 5), torch.device("cpu"), force=True)
    assert result.applies is False and "could not time" in result.reason
    assert torch.backends.cudnn.benchmark is before


def test_keeps_the_batchs_shape_dtype_and_memory_format_not_the_batch():
    batch = torch.randn(4, 3, 6, 6).contiguous(memory_format=torch.channels_last)
    spec = probe.BatchSpec.of(batch)
    alive = weakref.ref(batch)
    del batch
    gc.collect()
    assert alive() is None  # the spec holds no reference to the batch
    assert spec == probe.BatchSpec((4, 3, 6, 6), torch.float32, channels_last=True)
    made = spec.make(torch.device("cpu"))
    assert made.shape == (4, 3, 6, 6) and made.is_contiguous(memory_format=torch.channels_last)
    tokens = probe.BatchSpec.of(torch.ones(2, 5, dtype=torch.long)).make(torch.device("cpu"))
    assert tokens.dtype == torch.long and not tokens.any()
    assert probe.BatchSpec.of(torch.randn(1, 3, 1, 1)).channels_last is False  # ambiguous layout: the default


def test_bf16_true_is_timed_in_bf16_not_failed_on_a_dtype_error():
    model = conv_net().to(torch.bfloat16)
    model(torch.randn(2, 3, 8, 8, dtype=torch.bfloat16))
    result = probe.cudnn_benchmark_ab(
        model,
        spec_of(2, 3, 8, 8),
        torch.device("cpu"),
        precision_plugin=HalfPrecision("bf16-true"),
        force=True,
    )
    assert result.applies is True, result.reason


def test_mixed_precision_passes_run_under_autocast():
    model = conv_net()
    model(torch.randn(2, 3, 8, 8))
    autocast = []
    model[0].register_forward_hook(lambda m, i, o: autocast.append(torch.is_autocast_enabled("cpu")))
    plugin = MixedPrecision("bf16-mixed", "cpu")
    result = probe.cudnn_benchmark_ab(
        model, spec_of(2, 3, 8, 8), torch.device("cpu"), precision_plugin=plugin, force=True
    )
    assert result.applies is True
    assert autocast and all(autocast)


def test_not_enough_free_gpu_memory_skips(monkeypatch):
    gb = 10**9
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1 * gb, 80 * gb))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 70 * gb)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 69 * gb)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 79 * gb)  # a step took 10 GB
    reason = probe.memory_shortfall(torch.device("cuda", 0))
    assert "2.00 GB free" in reason and "10.00 GB" in reason
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 70 * gb)  # a step took 1 GB
    assert probe.memory_shortfall(torch.device("cuda", 0)) is None


def test_under_ddp_without_every_rank_no_rank_runs_it():
    model = conv_net()
    asked = []
    result = probe.run_on_ranks(
        model, spec_of(1, 3, 8, 8), torch.device("cpu"), world_size=2, agree=None, force=True
    )
    assert result.applies is False and "every rank" in result.reason
    result = probe.run_on_ranks(
        model,
        spec_of(1, 3, 8, 8),
        torch.device("cpu"),
        world_size=2,
        agree=lambda ok: asked.append(ok) or False,
    )
    assert asked == [False]  # this rank is on CPU: it says so, and nobody runs
    assert result.applies is False and "cpu" in result.reason


# --- two processes: a collective in forward, as SyncBatchNorm / FSDP / ZeRO-3 issue ------------------------


def forced_skip_reason(module, spec, device, force):
    return None if spec is not None else "no spec"


class CollectiveConvModel(L.LightningModule):
    """A conv net whose forward all-reduces, like SyncBatchNorm: a rank running it alone waits forever."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 2, 3)
        self.head = torch.nn.Linear(2 * 4 * 4, 1)

    def on_fit_start(self) -> None:
        probe.skip_reason = forced_skip_reason  # in this (spawned) process: the A/B on CPU, as on CUDA

    def forward(self, x):
        features = self.conv(x)
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(features)
        return self.head(features.flatten(1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.timeout(240)
def test_two_ranks_with_a_collective_in_forward_run_the_ab_together_and_finish(tmp_path):
    data = DataLoader(TensorDataset(torch.randn(32, 3, 6, 6), torch.randn(32, 1)), batch_size=4)
    callback = PerfCallback(enable_profiler=False, utilization=False, probe_num_workers="never")
    L_trainer = trainer(
        tmp_path,
        [callback],
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_epochs=1,
        log_every_n_steps=4,
    )
    L_trainer.fit(CollectiveConvModel(), data)
    summary = RunSummary.load(os.path.join(str(tmp_path), "lightning_logs", "version_0"))
    ab = summary.probes.cudnn_benchmark
    assert ab is not None
    assert ab.applies is True, ab.reason
    assert ab.ranks == 2
