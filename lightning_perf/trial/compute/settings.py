"""The compute settings of a command's rounds, in tune's names, and a winner among them in the project's terms.

* ``matmul_precision``: ``torch.set_float32_matmul_precision(value)`` before the fit ("high": TF32 on CUDA);
* ``compile``: ``torch.compile`` of the LightningModule given to ``Trainer.fit`` (Lightning then runs its
  ``forward`` compiled); compile time is kept apart from the step times by the PerfCallback;
* ``channels_last``: the model's parameters and the batches' 4-D tensors in ``torch.channels_last`` memory format;
* ``fused_optimizer``: the optimizers ``configure_optimizers`` returns step with ``fused=True`` where torch has
  the fused kernel for them on their device, else ``foreach=True``.

``precision`` (``bf16-mixed``) is a Trainer setting (:data:`lightning_perf.trial.project.command.TRAINER_SETTINGS`).
Pure: names, value checks and text; the run-time side is :mod:`lightning_perf.trial.compute.apply`.
"""

from __future__ import annotations

import json
from typing import Any

COMPUTE_SETTINGS = ("matmul_precision", "compile", "channels_last", "fused_optimizer")
MATMUL_PRECISIONS = ("highest", "high", "medium")
# Each changes the computation its own way, so a finding that asks for several gets one candidate for each (and
# their combination): bundled, a slower one would hide a faster one.
ALONE = ("precision", *COMPUTE_SETTINGS)
# torch.compile's backend in the rounds (torch's default, inductor, without it). For tests: "eager" traces with
# dynamo but generates no code, seconds instead of inductor's ~20 s first compile on a 2-core machine.
COMPILE_BACKEND_ENV = "LIGHTNING_PERF_COMPILE_BACKEND"
# how a round made the optimizer step, as the facts record it
FUSED, FOREACH = "fused", "foreach"


def check_value(key: str, value: Any) -> str | None:
    """Why ``value`` is not one the compute setting ``key`` takes, or None."""
    if key == "matmul_precision" and value not in MATMUL_PRECISIONS:
        return f"matmul_precision must be one of {', '.join(MATMUL_PRECISIONS)}, got {value!r}"
    if key in ("compile", "channels_last", "fused_optimizer") and not isinstance(value, bool):
        return f"{key} must be true or false, got {value!r}"
    return None


def code_lines(facts: dict[str, Any], changes: dict[str, Any]) -> list[str]:
    """Where and how the project sets each compute setting of ``changes``, from what its diagnosis round saw
    (``facts["compute"]``: the script, the line that called ``Trainer.fit``, the model's class, the optimizers)."""
    seen = facts.get("compute") or {}
    script = seen.get("script") or "your training script"
    fit = seen.get("fit_site") or "the code that calls Trainer.fit"
    model = seen.get("model") or {}
    lines = []
    for key, value in changes.items():
        if key == "matmul_precision":
            lines.append(
                f"{script}: at the top of the script: torch.set_float32_matmul_precision({json.dumps(value)})"
            )
        elif key == "compile" and value:
            lines.append(f"{fit}: compile the model before the fit: model = torch.compile(model)")
        elif key == "channels_last" and value:
            where = model.get("site") or model.get("class") or "your LightningModule"
            lines.append(f"{fit}: before the fit: model = model.to(memory_format=torch.channels_last)")
            lines.append(
                f"{where}: give the batches' images the same format in on_after_batch_transfer: "
                "images.contiguous(memory_format=torch.channels_last)"
            )
        elif key == "fused_optimizer" and value:
            lines += _optimizer_lines(seen.get("optimizers") or [])
    return lines


def _optimizer_lines(optimizers: list[dict[str, Any]]) -> list[str]:
    if not optimizers:
        return ["configure_optimizers: build the optimizer with fused=True (or foreach=True)"]
    lines = []
    for optimizer in optimizers:
        site = optimizer.get("site") or "configure_optimizers"
        name = optimizer.get("class") or "the optimizer"
        how = optimizer.get("step")
        if how in (FUSED, FOREACH):
            lines.append(f"{site}: {name}(..., {how}=True)")
        else:
            lines.append(f"{site}: {name} takes neither fused nor foreach: nothing to set")
    return lines
