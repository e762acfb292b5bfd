"""Spans that name the user's code in a profiled cycle's trace: each module's forward as ``nn.Module: <path>``
(its path in the LightningModule's ``named_modules()``: ``encoder.layer3.1.conv2``), so the trace's operators
can be read back to the module that ran them (``traces.figures.modules``), and backward ones to the module whose
forward created them (by the autograd sequence number the trace keeps on both).

Registered as global forward hooks while a profiler runs (warm-up and active batches of a cycle) and removed when
it stops: the steps between cycles pay nothing. Each span is a ``record_function`` (as Lightning's own
PyTorchProfiler names its hooks), entered by the pre-hook and left by the forward hook.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.modules import module as nn_module

from lightning_perf import console

log = console.logger(__name__)

MODULE_PREFIX = "nn.Module: "


class ModuleSpans:
    """Global forward hooks naming each module's forward in the trace, on while :meth:`start`-ed."""

    def __init__(self, root: torch.nn.Module) -> None:
        self._paths = {id(m): path for path, m in root.named_modules() if path}
        self._root = id(root)
        self._root_name = type(root).__name__
        self._open: list[tuple[int, Any]] = []
        self._handles: list[Any] = []
        # a torch.compile'd model runs its modules inside graphs (their hooks would guard and recompile): its
        # compiled regions are named in the trace by dynamo's own spans, ``Torch-Compiled Region: 0/0``
        self._compiled = is_compiled(root)

    def start(self) -> None:
        if self._handles or self._compiled:
            return
        self._handles = [
            nn_module.register_module_forward_pre_hook(self._enter),
            nn_module.register_module_forward_hook(self._exit, always_call=True),
        ]

    def stop(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        while self._open:  # a forward that raised left its span open
            torch.ops.profiler._record_function_exit(self._open.pop()[1])

    def _name(self, module: torch.nn.Module) -> str:
        key = id(module)
        if key == self._root:
            return self._root_name
        return self._paths.get(key) or type(module).__name__  # a module outside the model: its class

    def _enter(self, module: torch.nn.Module, args: Any) -> None:
        handle = torch.ops.profiler._record_function_enter_new(MODULE_PREFIX + self._name(module), None)
        self._open.append((id(module), handle))

    def _exit(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        key = id(module)
        while self._open:
            opened, handle = self._open.pop()
            torch.ops.profiler._record_function_exit(handle)
            if opened == key:
                break


def recording_switch(spans: ModuleSpans, hooks: Any) -> Any:
    """What a :class:`~lightning_perf.collect.profiling.profiler_window.ProfilerWindow` calls when its profiler
    starts (True) and stops (False): the module spans, and the hook profiler's spans of Lightning's hooks
    (``hooks``: a :class:`~lightning_perf.collect.steps.hook_profiler.HookProfiler`, or None). Never raises: the
    spans help read the trace, they are never a reason to lose it."""

    def switch(on: bool) -> None:
        try:
            if hooks is not None:
                hooks.recording = on
            spans.start() if on else spans.stop()
        except Exception as err:
            log.warning(f"lightning-perf: could not name the code in the trace: {err}")

    return switch


def is_compiled(module: torch.nn.Module) -> bool:
    """Whether ``module`` or one of its submodules runs under ``torch.compile``."""
    if getattr(module, "_compiled_call_impl", None) is not None or getattr(module, "_compiler_ctx", None):
        return True
    return any(type(m).__name__ == "OptimizedModule" for m in module.modules())
