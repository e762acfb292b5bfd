"""How far from the device's limit (issue 44), on real CPU fits: the FLOPs of one training step counted once a fit,
per module, and the user's own figure instead."""

from __future__ import annotations

import itertools

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_perf import PerfCallback
from lightning_perf.analysis.summary import RunSummary
from lightning_perf.collect.flop_count import COUNTED_BATCH
from lightning_perf.errors import ConfigError
from tests.helpers import trainer


class LinearStack(L.LightningModule):
    """Linear layers with ReLUs between them: a step's matmuls are known in closed form."""

    def __init__(self, widths=(64, 128, 32)):
        super().__init__()
        layers = []
        for i, (width_in, width_out) in enumerate(itertools.pairwise(widths)):
            layers += [torch.nn.ReLU()] if i else []
            layers.append(torch.nn.Linear(width_in, width_out))
        self.net = torch.nn.Sequential(*layers)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def stack_data(widths, batch_size, steps=12):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(steps * batch_size, widths[0], generator=generator)
    y = torch.randn(steps * batch_size, widths[-1], generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size)


def fit(tmp_path, model, data, **callback_kwargs) -> RunSummary:
    callback = PerfCallback(
        probe_num_workers="never", enable_profiler=False, utilization=False, **callback_kwargs
    )
    trainer(tmp_path, [callback]).fit(model, data)
    return callback.last_summary


def test_the_flops_of_a_linear_stack_are_the_analytic_count(tmp_path):
    widths, batch = (64, 128, 96, 32), 16
    summary = fit(tmp_path, LinearStack(widths), stack_data(widths, batch))
    step = summary.compute_limit.step
    # 2 x in x out x batch a matmul: the forward, the weight's gradient and (past the first layer, whose input
    # needs no gradient) the input's gradient
    per_layer = [
        2 * i * o * batch * (2 if n == 0 else 3) for n, (i, o) in enumerate(itertools.pairwise(widths))
    ]
    assert step.flops == pytest.approx(sum(per_layer), rel=0.01)
    assert step.source == "counted" and step.batch == COUNTED_BATCH and not step.not_counted
    # per module, under the paths of named_modules(): each Linear its own count, the Sequential their sum
    flops = {m.path: m.flops for m in step.modules}
    for n, path in enumerate(["net.0", "net.2", "net.4"]):
        assert flops[path] == pytest.approx(per_layer[n], rel=0.01)
    assert flops["net"] == pytest.approx(sum(per_layer), rel=0.01)
    assert {m.path for m in step.modules if m.leaf} == {"net.0", "net.2", "net.4"}
    assert step.operator_calls["aten.addmm"] == 3  # one forward matmul a layer
    # the counted step is left out of the step times (the count's dispatch slowed it): 12 batches, the first
    # timed apart as the epoch's start, one counted
    assert summary.timing.steps == 10
    # and the section round-trips through perf_summary.json
    assert RunSummary.load(summary.log_dir).compute_limit.step.flops == step.flops


def test_a_step_with_nothing_to_count_says_so(tmp_path):
    class NoMatmul(LinearStack):
        def training_step(self, batch, batch_idx):
            x, _ = batch
            return (x * self.net[0].bias[0]).square().mean()

    summary = fit(tmp_path, NoMatmul(), stack_data((64, 128, 32), 4))
    step = summary.compute_limit.step
    assert step.flops == 0 and step.modules == []
    assert step.not_counted == ["no matmul, convolution or attention ran in the counted step"]


def test_the_users_flops_per_batch_replaces_the_count(tmp_path):
    summary = fit(tmp_path, LinearStack(), stack_data((64, 128, 32), 4), flops_per_batch=5e6)
    step = summary.compute_limit.step
    assert (step.flops, step.source, step.batch, step.modules) == (5e6, "user", None, [])
    assert summary.compute_limit.achieved_flops_per_s == pytest.approx(
        5e6 / (summary.timing.step_time_ms.mean / 1e3)
    )


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), "1e9", True])
def test_a_bad_flops_per_batch_is_refused(bad):
    with pytest.raises(ConfigError, match="flops_per_batch"):
        PerfCallback(flops_per_batch=bad)


def test_a_fit_that_fails_inside_the_counted_step_leaves_no_counter_behind(tmp_path):
    class Fails(LinearStack):
        def training_step(self, batch, batch_idx):
            if batch_idx == COUNTED_BATCH:
                raise RuntimeError("injected failure")
            return super().training_step(batch, batch_idx)

    callback = PerfCallback(probe_num_workers="never", enable_profiler=False, utilization=False)
    with pytest.raises(RuntimeError, match="injected failure"):
        trainer(tmp_path, [callback]).fit(Fails(), stack_data((64, 128, 32), 4))
    assert callback.last_summary.compute_limit is None
    # no FlopCounterMode is left active: a matmul after the fit runs outside any dispatch mode
    assert not torch._C._len_torch_dispatch_stack()
