"""Timing every hook of a training step, for the step's anatomy (``analysis.compute.anatomy``).

Lightning asks ``trainer.profiler`` to time every hook it calls, by name
(``with trainer.profiler.profile("[Callback]ModelCheckpoint.on_train_batch_end"): ...``). During a fit the
callback puts a :class:`HookProfiler` in its place: it keeps the self time of each name (its time less the
names inside it) and hands ``start``/``stop`` on to the user's own profiler, which keeps its report. With
Lightning's default ``PassThroughProfiler`` it costs less than that one does (0.90 against 1.16 us a hook here,
benchmarks/bench_hook_profiler.py: a class with ``__enter__``/``__exit__`` instead of a generator context
manager), so timing every hook makes a step cheaper, not dearer. The loggers' ``log_metrics``/``save`` are
timed the same way, by a wrapper on each logger instance, removed after the fit.

Per batch the names' seconds go to a dict of their own; the step clock's boundaries rotate it
(:meth:`next_batch`), a batch the clock leaves out (a compilation, the FLOP count) is marked, and the batches
are sorted and summed at each logging window, off the step's clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from time import perf_counter
from typing import Any

import torch

from lightning_perf.analysis.compute import anatomy
from lightning_perf.collect.namespaces import is_instance
from lightning_perf.collect.profiling.module_spans import ModuleSpans, recording_switch

_enter_span = torch.ops.profiler._record_function_enter_new
_exit_span = torch.ops.profiler._record_function_exit
_DROPPED = "lightning_perf: dropped"  # the mark of a batch left out (no hook is named so)


class HookProfiler:
    """A stand-in for ``trainer.profiler`` that times every named hook; see the module docstring."""

    def __init__(self, inner: Any, callback_kinds: dict[str, str]) -> None:
        self.inner = inner
        # with Lightning's default profiler there is nothing to hand on
        self._hand_on = not is_instance(inner, "profilers", "PassThroughProfiler")
        self.callback_kinds = callback_kinds
        self._stack: list[list[Any]] = []  # [name, start, seconds of the names inside]
        self._name = ""
        self._current: dict[str, float] = {}
        self._batches: list[dict[str, float]] = []  # the batches since the last window, kept or not
        self.window_seconds: dict[str, float] = {}  # summed by take_window
        self.total_seconds: dict[str, float] = {}
        self.total_batches = 0
        self.suspended = False  # the callback's own logging: neither the loggers' nor a step's
        self.recording = (
            False  # a profiler runs: each hook is also a span of the trace, as Lightning names it
        )

    # -- Lightning's Profiler interface -------------------------------------------------------------------

    def profile(self, action_name: str) -> HookProfiler:
        self._name = action_name  # __enter__ follows at once: Lightning runs one hook at a time
        return self

    def __enter__(self) -> None:
        name = self._name
        if self._hand_on:
            self.inner.start(name)
        span = _enter_span(name, None) if self.recording else None
        self._stack.append([name, perf_counter(), 0.0, span])

    def __exit__(self, *exc: object) -> None:
        name, started, inside, span = self._stack.pop()
        took = perf_counter() - started
        if span is not None:
            _exit_span(span)
        current = self._current
        current[name] = current.get(name, 0.0) + took - inside
        if self._stack:
            self._stack[-1][2] += took
        if self._hand_on:
            self.inner.stop(name)

    def start(self, action_name: str) -> None:
        # Lightning's start/stop pairs: the fetch and the manual optimizer step. No span of the trace for them:
        # one around the DataLoader's own would hide it from torch-tb-profiler's DataLoader share
        if self._hand_on:
            self.inner.start(action_name)
        self._stack.append([action_name, perf_counter(), 0.0, None])

    def stop(self, action_name: str) -> None:
        if self._stack and self._stack[-1][0] == action_name:
            self.__exit__()
        elif self._hand_on:
            self.inner.stop(action_name)

    def __getattr__(self, name: str) -> Any:
        # everything else (describe, summary, setup, teardown, dirpath, ...) is the user's profiler's
        return getattr(self.inner, name)

    # -- the step clock's events ----------------------------------------------------------------------------

    def next_batch(self) -> None:
        """A batch boundary, on the step's clock: only a swap; which batches count is decided off the clock,
        in :meth:`take_window`. An empty batch (no hook ran) is no batch and costs no new dict."""
        current = self._current
        if current:
            self._batches.append(current)
            self._current = {}

    def drop_batch(self) -> None:
        """The open step is left out of the figures (it compiled, or its FLOPs were counted)."""
        self._current[_DROPPED] = 1.0

    def exclude(self, seconds: float) -> None:
        """The callback's own work inside the open step, left out of the step's time."""
        current = self._current
        current[anatomy.EXCLUDED] = current.get(anatomy.EXCLUDED, 0.0) + seconds

    def take_window(self) -> tuple[dict[str, float], int]:
        """The seconds per name of the batches kept since the last call, and how many batches they are."""
        # a batch whose step was left out is dropped; what ran between the last batch of an epoch (or the fit's
        # start) and the next fetch is no batch either: it ran no training batch
        kept = [b for b in self._batches if _DROPPED not in b and anatomy.RUN_TRAINING_BATCH in b]
        self._batches = []
        seconds: dict[str, float] = {}
        for batch in kept:
            anatomy.merge(seconds, batch)
        batches = len(kept)
        anatomy.merge(self.total_seconds, seconds)
        self.total_batches += batches
        return seconds, batches

    # -- the loggers' writes ----------------------------------------------------------------------------------

    def time_logger(self, logger: Any) -> None:
        """Time ``logger``'s ``log_metrics`` and ``save`` as ``[Logger]<class>.<method>`` spans."""
        for method in ("log_metrics", "save"):
            original = getattr(logger, method, None)
            if original is None or method in vars(logger):
                continue
            setattr(
                logger,
                method,
                self._timed(f"{anatomy.LOGGER_PREFIX}{type(logger).__name__}.{method}", original),
            )

    def _timed(self, name: str, original: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.suspended:
                return original(*args, **kwargs)
            self._name = name
            self.__enter__()
            try:
                return original(*args, **kwargs)
            finally:
                self.__exit__()

        timed.lightning_perf_timed = True  # type: ignore[attr-defined]
        return timed


def untime_logger(logger: Any) -> None:
    for method in ("log_metrics", "save"):
        if getattr(vars(logger).get(method), "lightning_perf_timed", False):
            delattr(logger, method)


def callback_kinds(callbacks: list[Any], ours: Any) -> dict[str, str]:
    """Each callback's state key (the name Lightning times its hooks by) and what kind of code it is."""
    kinds = {}
    for callback in callbacks:
        try:
            key = callback.state_key
        except Exception:  # a state key that cannot be computed: its hooks count as a callback's
            continue
        if callback is ours:
            kinds[key] = anatomy.OURS
        elif is_instance(callback, "callbacks", "ProgressBar"):
            kinds[key] = anatomy.PROGRESS_BAR_KIND
        else:
            kinds[key] = anatomy.CALLBACK
    return kinds


def install(trainer: Any, ours: Any, session: Any) -> None:
    """Put a :class:`HookProfiler` in ``trainer.profiler``'s place, time the loggers, and name the hooks and the
    model's modules in the profiled cycles' traces (``session``: the fit's PerfSession); :func:`uninstall` puts
    everything back."""
    hooks = HookProfiler(trainer.profiler, callback_kinds(list(trainer.callbacks), ours))
    trainer.profiler = hooks
    for logger in trainer.loggers:
        hooks.time_logger(logger)
    session.hooks = session.clock.hooks = hooks
    if session.window is not None:
        session.window.on_recording = recording_switch(ModuleSpans(trainer.lightning_module), hooks)


def uninstall(trainer: Any, hooks: HookProfiler | None) -> None:
    if hooks is None:
        return
    if trainer.profiler is hooks:
        trainer.profiler = hooks.inner
    for logger in trainer.loggers:
        untime_logger(logger)


def window_anatomy(
    hooks: HookProfiler, step_ms: float | None, data_wait_ms: float | None
) -> dict[str, float]:
    """The window's parts as metrics (``perf_anatomy/<part>_ms``), from the batches it kept."""
    seconds, batches = hooks.take_window()
    parts = anatomy.anatomy(seconds, batches, step_ms or 0.0, data_wait_ms, hooks.callback_kinds)
    if parts is None:
        return {}
    return {f"perf_anatomy/{part}_ms": ms for part, ms in parts.parts_ms.items() if part != anatomy.DATA_WAIT}


def run_anatomy(
    hooks: HookProfiler, step_ms: float | None, data_wait_ms: float | None
) -> anatomy.StepAnatomy | None:
    """The whole fit's parts (the last batch kept, the last window summed)."""
    hooks.next_batch()
    hooks.take_window()
    return anatomy.anatomy(
        hooks.total_seconds, hooks.total_batches, step_ms or 0.0, data_wait_ms, hooks.callback_kinds
    )


@contextmanager
def paused(hooks: HookProfiler | None) -> Iterator[None]:
    """The callback's own work: its writes through the loggers are not the loggers' part of a step."""
    if hooks is None:
        yield
        return
    hooks.suspended = True
    try:
        yield
    finally:
        hooks.suspended = False
