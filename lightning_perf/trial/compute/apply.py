"""The compute settings of a round (:mod:`lightning_perf.trial.compute.settings`) applied inside the user's command.

:func:`fit_arguments` runs in the wrapped ``Trainer.fit`` (:mod:`lightning_perf.trial.project.inject`), just before
Lightning starts the fit, on the LightningModule given to it:

* ``matmul_precision``: ``torch.set_float32_matmul_precision``, at the last moment so the script's own call
  before the fit does not undo it;
* ``channels_last``: the model's 4-D parameters converted, and its ``on_after_batch_transfer`` wrapped so each
  batch's 4-D tensors reach the model in the same format;
* ``fused_optimizer``: its ``configure_optimizers`` wrapped; each optimizer it returns steps with ``fused=True``
  where a one-step trial of a throwaway copy shows torch has that kernel for the parameters' device and dtype,
  else ``foreach=True``. Set on the optimizer's own parameter groups (they are read at every step), not by
  building a new optimizer: an LR scheduler holds the one it was given;
* ``compile``: ``torch.compile(model)`` handed to ``fit`` (Lightning then runs the module's ``forward``
  compiled), with the backend of :data:`~lightning_perf.trial.compute.settings.COMPILE_BACKEND_ENV` if set.

:func:`compute_facts` tells the parent where the project would set them (``Trainer.fit``'s line, the model's
class, each optimizer and how it can step).
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch

from lightning_perf.trial.compute.settings import COMPILE_BACKEND_ENV, FOREACH, FUSED

INDUCTOR = "inductor"  # torch.compile's default backend


def fit_arguments(
    settings: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``Trainer.fit``'s arguments with the model prepared for the round's compute settings."""
    if settings.get("matmul_precision"):
        torch.set_float32_matmul_precision(settings["matmul_precision"])
    by_name = not args
    model = kwargs.get("model") if by_name else args[0]
    if not isinstance(model, torch.nn.Module):
        return args, kwargs
    if settings.get("channels_last"):
        model.to(memory_format=torch.channels_last)
        _batches_channels_last(model)
    if settings.get("fused_optimizer"):
        _fused_optimizers(model)
    if settings.get("compile"):
        model = torch.compile(model, backend=os.environ.get(COMPILE_BACKEND_ENV) or INDUCTOR)
    if by_name:
        return args, {**kwargs, "model": model}
    return (model, *args[1:]), kwargs


def _channels_last(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous(memory_format=torch.channels_last) if tensor.dim() == 4 else tensor


def _batches_channels_last(model: Any) -> None:
    from lightning_utilities.core.apply_func import apply_to_collection

    original = model.on_after_batch_transfer

    def on_after_batch_transfer(batch: Any, dataloader_idx: int) -> Any:
        return apply_to_collection(original(batch, dataloader_idx), torch.Tensor, _channels_last)

    model.on_after_batch_transfer = on_after_batch_transfer


def _fused_optimizers(model: Any) -> None:
    original = model.configure_optimizers

    def configure_optimizers() -> Any:
        returned = original()
        for optimizer in optimizers_in(returned):
            how = step_kind(optimizer)
            if how is None:
                continue
            other = FOREACH if how == FUSED else FUSED
            for group in optimizer.param_groups:  # fused and foreach may not both be on
                group[how], group[other] = True, False
            optimizer.defaults[how], optimizer.defaults[other] = True, False
        return returned

    model.configure_optimizers = configure_optimizers


def optimizers_in(returned: Any) -> list[torch.optim.Optimizer]:
    """The optimizers in what ``configure_optimizers`` may return: one, a list or tuple, a dict with
    ``optimizer``, or lists of those (the LR schedulers beside them are left alone)."""
    found: list[torch.optim.Optimizer] = []
    stack = [returned]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.optim.Optimizer):
            if not any(item is seen for seen in found):
                found.append(item)
        elif isinstance(item, Mapping):
            stack.append(item.get("optimizer"))
        elif isinstance(item, list | tuple):
            stack.extend(reversed(item))
    return found


def step_kind(optimizer: torch.optim.Optimizer) -> str | None:
    """FUSED where the optimizer's class takes ``fused`` and torch has that kernel for its parameters, FOREACH
    where it takes ``foreach``, else None."""
    taken = inspect.signature(type(optimizer).__init__).parameters
    if "fused" in taken and _fused_runs(optimizer, taken):
        return FUSED
    return FOREACH if "foreach" in taken else None


def _fused_runs(optimizer: torch.optim.Optimizer, taken: Mapping[str, Any]) -> bool:
    """One step of a fused copy of the optimizer (its class and options) on a tensor of each of its parameters'
    device and dtype: torch refuses a device or dtype it has no fused kernel for there."""
    kinds = {(p.device, p.dtype) for group in optimizer.param_groups for p in group["params"]}
    # the optimizer's own class: its keywords (``fused`` among them), not the base Optimizer's
    make: Callable[..., torch.optim.Optimizer] = type(optimizer)
    options = {k: v for k, v in optimizer.defaults.items() if k in taken and k not in (FUSED, FOREACH)}
    for device, dtype in kinds:
        probe = torch.zeros(2, device=device, dtype=dtype, requires_grad=True)
        probe.grad = torch.zeros_like(probe)
        try:
            make([probe], **options, fused=True).step()
        except Exception:  # noqa: BLE001 - any refusal means: not fused here
            return False
    return bool(kinds)


def compute_facts(run: Any, trainer: Any) -> dict[str, Any]:
    """Where the project would set each compute setting: its script, the line that called ``Trainer.fit``, the
    LightningModule's class and where it is defined, each optimizer's class and how it can step."""
    model = getattr(trainer, "lightning_module", None)
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    built = _class_facts(type(model), "configure_optimizers")["site"] if model is not None else None
    return {
        "script": os.path.abspath(main) if main else None,
        "fit_site": getattr(run, "fit_site", None),
        "model": _class_facts(type(model)) if model is not None else None,
        "optimizers": [
            {"class": _class_name(type(optimizer)), "site": built, "step": step_kind(optimizer)}
            for optimizer in getattr(trainer, "optimizers", None) or []
        ],
    }


def _class_name(cls: type) -> str:
    """``torch.optim.AdamW`` for torch's own optimizers, else the module and name."""
    if getattr(torch.optim, cls.__name__, None) is cls:
        return f"torch.optim.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def _class_facts(cls: type, method: str | None = None) -> dict[str, Any]:
    """A class (or one of its methods): its name and ``file:line``, None where the source is unknown."""
    target = getattr(cls, method) if method else cls
    try:
        site = f"{os.path.abspath(inspect.getsourcefile(target) or '')}:{inspect.getsourcelines(target)[1]}"
    except (OSError, TypeError):
        site = None
    return {"class": _class_name(cls), "site": site}
