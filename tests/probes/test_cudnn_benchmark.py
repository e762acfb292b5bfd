"""The cudnn.benchmark A/B leaves the user's model and flag exactly as it found them."""

import torch

from lightning_perf.probes.cudnn_benchmark import cudnn_benchmark_ab


def conv_net():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.LazyLinear(2),
    )


def test_runs_both_ways_and_restores_flag_buffers_and_grads():
    model = conv_net()
    inputs = torch.randn(2, 3, 8, 8)
    model(inputs)  # materialise the lazy layer
    model.eval()
    buffers = [b.clone() for b in model.buffers()]
    before = torch.backends.cudnn.benchmark
    result = cudnn_benchmark_ab(model, inputs, torch.device("cpu"), force=True)
    assert result["applies"] is True
    assert result["off_ms"] > 0 and result["on_ms"] > 0
    assert result["speedup"] == result["off_ms"] / result["on_ms"]
    assert torch.backends.cudnn.benchmark is before
    assert not model.training  # mode restored
    assert all(torch.equal(a, b) for a, b in zip(buffers, model.buffers(), strict=True))
    assert all(p.grad is None for p in model.parameters())


def test_says_why_it_does_not_apply():
    model = conv_net()
    assert "cpu" in cudnn_benchmark_ab(model, torch.randn(1, 3, 8, 8), torch.device("cpu"))["reason"]
    linear = torch.nn.Linear(3, 1)
    assert (
        cudnn_benchmark_ab(linear, torch.randn(1, 3), torch.device("cuda"))["reason"]
        == "the model has no convolutions"
    )
    assert cudnn_benchmark_ab(model, None, torch.device("cuda"))["applies"] is False


def test_a_forward_that_rejects_the_batch_is_reported_not_raised():
    model = conv_net()
    before = torch.backends.cudnn.benchmark
    result = cudnn_benchmark_ab(model, torch.randn(2, 5), torch.device("cpu"), force=True)
    assert result["applies"] is False and "could not time" in result["reason"]
    assert torch.backends.cudnn.benchmark is before
