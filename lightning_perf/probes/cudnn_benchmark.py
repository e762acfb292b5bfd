"""In-run A/B of ``torch.backends.cudnn.benchmark``: the same model and batch timed with the flag off and on.

cudnn.benchmark makes cuDNN try its convolution algorithms for each new input shape and keep the fastest; it
pays off when shapes are constant. Rather than guess, time a few forward/backward passes of the user's model on
one real batch both ways (after training, outside any timed step) and restore the user's setting. The model is
left as it was: gradients go through ``torch.autograd.grad`` (``.grad`` untouched) and buffers such as
BatchNorm running statistics are restored after the extra passes.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable
from time import perf_counter
from typing import Any

import torch

from lightning_perf.collect.settings_fingerprint import model_has_conv

# passes discarded while cuDNN autotunes (benchmark mode searches on the first pass of a shape)
WARMUP_PASSES = 2
TIMED_PASSES = 5


def _timed_passes(
    module: torch.nn.Module, inputs: torch.Tensor, synchronize: Callable[[], None], passes: int
) -> list[float]:
    params = [p for p in module.parameters() if p.requires_grad]
    times = []
    for _ in range(passes):
        synchronize()
        start = perf_counter()
        output = module(inputs)
        loss = output.float().sum() if isinstance(output, torch.Tensor) else None
        if loss is None:
            raise TypeError(f"forward returned {type(output).__name__}, not a tensor")
        if params:
            torch.autograd.grad(loss, params, allow_unused=True)
        synchronize()
        times.append((perf_counter() - start) * 1e3)
    return times


def cudnn_benchmark_ab(
    module: torch.nn.Module,
    inputs: torch.Tensor | None,
    device: torch.device,
    *,
    synchronize: Callable[[], None] | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Time ``module(inputs)`` forward+backward with cudnn.benchmark off and on; the user's flag is restored.

    Returns a JSON-ready dict: ``applies`` (bool) and ``reason`` always; ``off_ms``, ``on_ms`` (medians) and
    ``speedup`` (off / on) when it ran. ``force`` runs it also where cuDNN is not used (tests on CPU).
    """
    if not force:
        if device.type != "cuda":
            return {
                "applies": False,
                "reason": f"training on {device.type}: cudnn.benchmark only changes CUDA convolutions",
            }
        if not model_has_conv(module):
            return {"applies": False, "reason": "the model has no convolutions"}
    if inputs is None:
        return {"applies": False, "reason": "no tensor batch was kept to time the model on"}
    if synchronize is None:
        synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    user_setting = torch.backends.cudnn.benchmark
    was_training = module.training
    saved_buffers = [(buffer, buffer.detach().clone()) for buffer in module.buffers()]
    results: dict[str, list[float]] = {}
    try:
        module.train()
        for label, flag in (("off", False), ("on", True)):
            torch.backends.cudnn.benchmark = flag
            _timed_passes(module, inputs, synchronize, WARMUP_PASSES)
            results[label] = _timed_passes(module, inputs, synchronize, TIMED_PASSES)
    except Exception as err:  # a model whose forward does not take the batch's first tensor, OOM, ...
        return {"applies": False, "reason": f"could not time the model on the batch: {err}"}
    finally:
        torch.backends.cudnn.benchmark = user_setting
        module.train(was_training)
        with torch.no_grad():
            for buffer, saved in saved_buffers:
                buffer.copy_(saved)
        with contextlib.suppress(Exception):
            synchronize()
    off_ms, on_ms = statistics.median(results["off"]), statistics.median(results["on"])
    return {
        "applies": True,
        "reason": f"median of {TIMED_PASSES} forward+backward passes on one training batch",
        "off_ms": off_ms,
        "on_ms": on_ms,
        "speedup": off_ms / on_ms if on_ms > 0 else None,
        "user_setting": user_setting,
    }
