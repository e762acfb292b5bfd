"""In-run A/B of ``torch.backends.cudnn.benchmark``: the user's model timed with the flag off and on.

cudnn.benchmark makes cuDNN try its convolution algorithms for each new input shape and keep the fastest; it
pays off when shapes are constant. Rather than guess, time a few forward/backward passes of the user's model
both ways after training (outside any timed step) and restore everything:

- the input is made from a :class:`BatchSpec` (shape, dtype, memory format of a training batch), so no real
  batch stays on the GPU for the whole run;
- the passes run inside the precision plugin's forward context (autocast for 16-mixed/bf16-mixed, the half
  default dtype for 16-true/bf16-true) on the plugin's converted input: what training ran is what is timed;
- RNG state is forked (dropout, the random input), gradients are set aside on the host and put back, and
  gradients of the passes go through ``torch.autograd.grad`` (``.grad`` untouched); buffers such as
  BatchNorm running statistics are restored; the user's flag is restored;
- it runs only where it cannot deadlock: a single process, or every rank together when all ranks agree to
  (a SyncBatchNorm, FSDP or DeepSpeed ZeRO-3 forward issues collectives every rank must join);
- a free-memory check first: the passes need about what a training step needed.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import torch

from lightning_perf.analysis.probe_results import CudnnAB
from lightning_perf.collect.settings_fingerprint import model_has_conv

# passes discarded while cuDNN autotunes (benchmark mode searches on the first pass of a shape)
WARMUP_PASSES = 2
TIMED_PASSES = 5
# The A/B's passes allocate about what one training step did (its activations and gradients); ask for that
# much free device memory plus a tenth for allocator fragmentation. Our choice: a run at the edge of its memory
# is better left alone than risked for an advisory figure.
MEMORY_MARGIN = 1.1

Agree = Callable[[bool], bool]


@dataclass(frozen=True)
class BatchSpec:
    """What the A/B needs of a training batch's first tensor: its shape, dtype and memory format."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    channels_last: bool = False

    @classmethod
    def of(cls, tensor: torch.Tensor | None) -> BatchSpec | None:
        if tensor is None:
            return None
        channels_last = tensor.dim() == 4 and tensor.is_contiguous(memory_format=torch.channels_last)
        channels_last = (
            channels_last and not tensor.is_contiguous()
        )  # both hold for 1x1 images: not channels_last
        return cls(tuple(tensor.shape), tensor.dtype, channels_last)

    def make(self, device: torch.device) -> torch.Tensor:
        """A tensor like the batch's: normal noise for floating point, zeros for integer (token ids, labels)."""
        if self.dtype.is_floating_point or self.dtype.is_complex:
            tensor = torch.randn(self.shape, dtype=self.dtype, device=device)
        else:
            tensor = torch.zeros(self.shape, dtype=self.dtype, device=device)
        return tensor.contiguous(memory_format=torch.channels_last) if self.channels_last else tensor


def collective_modules(module: torch.nn.Module) -> list[str]:
    """Names of module classes whose forward issues collectives (every rank must run it together)."""
    found = []
    for sub in module.modules():
        cls = type(sub)
        name, where = cls.__name__, cls.__module__
        fsdp = (
            "fsdp" in where or name in ("FullyShardedDataParallel", "FSDPModule") or name.startswith("FSDP")
        )
        if name == "SyncBatchNorm" or fsdp or where.startswith("deepspeed"):
            found.append(name)
    return sorted(set(found))


def skip_reason(
    module: torch.nn.Module, spec: BatchSpec | None, device: torch.device, force: bool
) -> str | None:
    """Why the A/B does not apply on this rank; None when it does. ``force`` times on any device (tests)."""
    if not force:
        if device.type != "cuda":
            return f"training on {device.type}: cudnn.benchmark only changes CUDA convolutions"
        if not model_has_conv(module):
            return "the model has no convolutions"
    if spec is None:
        return "no tensor batch was seen to time the model on"
    return None


def memory_shortfall(device: torch.device) -> str | None:
    """Why device memory is too short for the passes; None when there is enough (or nothing to check)."""
    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    cached_unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    step_peak = torch.cuda.max_memory_allocated(device) - torch.cuda.memory_allocated(device)
    needed = step_peak * MEMORY_MARGIN
    available = free + cached_unused
    if available < needed:
        return (
            f"not enough free GPU memory: {available / 1e9:.2f} GB free, a training step needed "
            f"{step_peak / 1e9:.2f} GB (x{MEMORY_MARGIN} margin)"
        )
    return None


@contextlib.contextmanager
def _gradients_set_aside(params: list[torch.nn.Parameter]) -> Iterator[None]:
    """The last step's ``.grad`` moved to host memory for the passes (freeing device memory), then put back."""
    saved = []
    for param in params:
        grad = param.grad
        if grad is not None:
            saved.append((param, grad.device, grad.to("cpu")))
            param.grad = None
    try:
        yield
    finally:
        for param, device, grad in saved:
            param.grad = grad.to(device)


def _timed_passes(
    module: torch.nn.Module,
    inputs: torch.Tensor,
    synchronize: Callable[[], None],
    forward_context: Callable[[], Any],
    passes: int,
) -> list[float]:
    params = [p for p in module.parameters() if p.requires_grad]
    times = []
    for _ in range(passes):
        synchronize()
        start = perf_counter()
        with forward_context():
            output = module(inputs)
        if not isinstance(output, torch.Tensor):
            raise TypeError(f"forward returned {type(output).__name__}, not a tensor")
        loss = output.float().sum()
        if params:
            torch.autograd.grad(loss, params, allow_unused=True)
        synchronize()
        times.append((perf_counter() - start) * 1e3)
    return times


def cudnn_benchmark_ab(
    module: torch.nn.Module,
    spec: BatchSpec | None,
    device: torch.device,
    *,
    precision_plugin: Any = None,
    synchronize: Callable[[], None] | None = None,
    force: bool = False,
) -> CudnnAB:
    """Time ``module`` forward+backward with cudnn.benchmark off and on, on one rank; everything is restored.

    Returns a :class:`CudnnAB`: ``applies`` and ``reason`` always; ``off_ms``, ``on_ms`` (medians) and
    ``speedup`` (off / on) when it ran. ``force`` runs it also where cuDNN is not used (tests on CPU).
    Call it on one process only where no rank's forward issues a collective; else see :func:`run_on_ranks`.
    """
    reason = skip_reason(module, spec, device, force) or memory_shortfall(device)
    if reason is not None or spec is None:  # skip_reason names a missing spec
        return CudnnAB(applies=False, reason=reason or "")
    if synchronize is None:
        synchronize = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    forward_context = getattr(precision_plugin, "forward_context", None) or contextlib.nullcontext
    convert = getattr(precision_plugin, "convert_input", None) or (lambda data: data)
    user_setting = torch.backends.cudnn.benchmark
    was_training = module.training
    saved_buffers = [(buffer, buffer.detach().clone()) for buffer in module.buffers()]
    params = [p for p in module.parameters() if p.requires_grad]
    results: dict[str, list[float]] = {}
    rng_devices = (
        [device.index if device.index is not None else torch.cuda.current_device()]
        if (device.type == "cuda")
        else []
    )
    try:
        with torch.random.fork_rng(devices=rng_devices), _gradients_set_aside(params):
            inputs = convert(spec.make(device))
            module.train()
            for label, flag in (("off", False), ("on", True)):
                torch.backends.cudnn.benchmark = flag
                _timed_passes(module, inputs, synchronize, forward_context, WARMUP_PASSES)
                results[label] = _timed_passes(module, inputs, synchronize, forward_context, TIMED_PASSES)
            del inputs
    except Exception as err:  # a model whose forward does not take the batch's first tensor, OOM, ...
        return CudnnAB(
            applies=False, reason=f"could not time the model on a batch like the training's: {err}"
        )
    finally:
        torch.backends.cudnn.benchmark = user_setting
        module.train(was_training)
        with torch.no_grad():
            for buffer, saved in saved_buffers:
                buffer.copy_(saved)
        with contextlib.suppress(Exception):
            synchronize()
    off_ms, on_ms = statistics.median(results["off"]), statistics.median(results["on"])
    return CudnnAB(
        applies=True,
        reason=f"median of {TIMED_PASSES} forward+backward passes on a batch shaped like the training's",
        off_ms=off_ms,
        on_ms=on_ms,
        speedup=off_ms / on_ms if on_ms > 0 else None,
        user_setting=user_setting,
    )


def run_on_ranks(
    module: torch.nn.Module,
    spec: BatchSpec | None,
    device: torch.device,
    *,
    world_size: int,
    agree: Agree | None,
    precision_plugin: Any = None,
    force: bool = False,
) -> CudnnAB:
    """The A/B as a run ends, on every rank: alone in a single process, else all ranks together or none.

    ``agree(ready)`` is a collective answering whether every rank is ready; it is None when not every rank
    reached the end of training the same way, and then no rank runs (a forward with a collective in it would
    wait for the others forever). Every rank gets its own result; rank zero's goes into the summary.
    """
    if world_size > 1:
        if agree is None:
            return CudnnAB(
                applies=False,
                reason="not every rank ended training together: a forward pass on some ranks only could "
                "wait forever on a collective (SyncBatchNorm, FSDP, DeepSpeed)",
            )
        local = skip_reason(module, spec, device, force) or memory_shortfall(device)
        if not agree(local is None):
            return CudnnAB(applies=False, reason=local or "another rank cannot run it, so no rank does")
    result = cudnn_benchmark_ab(module, spec, device, precision_plugin=precision_plugin, force=force)
    if world_size > 1 and result.applies:
        result.ranks = world_size
        result.collective_modules = collective_modules(module)
    return result
