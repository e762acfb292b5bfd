"""Timing every hook of a training step, for the step's anatomy (``analysis.compute.anatomy``).

Lightning asks ``trainer.profiler`` to time every hook it calls, by name
(``with trainer.profiler.profile("[Callback]ModelCheckpoint.on_train_batch_end"): ...``). During a fit the
callback puts a :class:`HookProfiler` in its place: it keeps the self time of each name (its time less the
names inside it) and hands every call on to the user's own profiler as Lightning would make it: its
``profile()`` where its class overrides Lightning's, its ``start``/``stop`` otherwise (which is all Lightning's
``Profiler.profile`` does), so the user's profiler keeps its report. It passes ``isinstance`` for the user's
profiler's class, and ``with trainer.profiler.profile(name) as got`` binds what the user's profiler binds. Each
``with`` closes its own entry: a ``start()`` left open by the user's code (harmless with Lightning's default
profiler) neither closes a hook's entry nor stays in the way. With Lightning's default ``PassThroughProfiler``
it costs less than that one does (0.89 against 1.07 us a hook here, benchmarks/bench_hook_profiler.py: a class
with ``__enter__``/``__exit__`` instead of a generator context manager), so timing every hook makes a step
cheaper, not dearer. The loggers' ``log_metrics``/``save`` are timed the same way, by a wrapper on each logger
instance, removed after the fit; the user's profiler never sees those (Lightning does not time them).

Per batch the names' seconds go to a dict of their own; the step clock's boundaries rotate it
(:meth:`next_batch`), and the step clock marks every batch it does not time as a step (the epoch's first
fetch, a compilation, the FLOP count: :meth:`drop_batch`) and stops the batch where it stops the step (an
interrupt: validation, a checkpoint, the epoch end: :meth:`interrupted`), so the anatomy covers the steps the
step clock timed and nothing else. The batches are sorted and summed at each logging window, off the step's
clock.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from time import perf_counter
from typing import Any

import torch

from lightning_perf.analysis.compute import anatomy
from lightning_perf.collect.namespaces import is_instance, loaded_types
from lightning_perf.collect.profiling.module_spans import ModuleSpans, recording_switch

_enter_span = torch.ops.profiler._record_function_enter_new
_exit_span = torch.ops.profiler._record_function_exit
_DROPPED = "lightning_perf: dropped"  # the mark of a batch left out (no hook is named so)
# the trace-span slot of an entry that start() pushed: it has no span, and no `with` closes it
_STARTED: Any = object()
_OURS: Any = object()  # the context slot of an entry of ours (a logger's write): nothing to hand on
# a start() left open ends with the `with` around it; of those with none around (another thread's), the oldest
# ends past this many, so the stack stays short however long the fit
MAX_OPEN_STARTS = 32
# every batch's hooks are timed up to this many batches (a short fit's anatomy is exact), then one batch in
# SAMPLE_EVERY at random: a 2,000-step fit times ~470, a 100,000-step one ~12,500
FULL_STEPS = 256
SAMPLE_EVERY = 8
_WEIGHT = "lightning_perf: weight"  # a sampled batch's weight in the means (no hook is named so)


class _Untimed:
    """What ``profile()`` hands back on a batch whose hooks are not timed (with Lightning's default profiler): a
    ``with`` that binds the name, as Lightning's does, and does nothing else."""

    __slots__ = ("name",)

    def __init__(self) -> None:
        self.name = ""

    def __enter__(self) -> str:
        return self.name

    def __exit__(self, exc_type: Any = None, exc: Any = None, tb: Any = None) -> None:
        return None


def _overrides_profile(profiler: Any) -> bool:
    """True when ``profiler``'s class has a ``profile()`` of its own, not Lightning's start/yield/stop."""
    own = getattr(type(profiler), "profile", None)
    bases = loaded_types("profilers", "Profiler")
    return own is not None and all(own is not getattr(base, "profile", None) for base in bases)


class HookProfiler:
    """A stand-in for ``trainer.profiler`` that times every named hook; see the module docstring.

    An entry of the stack is ``[name, start, seconds of the names inside, trace span, context]``: the context is
    the one the user's ``profile()`` returned, where it runs."""

    def __init__(self, inner: Any, callback_kinds: dict[str, str]) -> None:
        self.inner = inner
        # with Lightning's default profiler there is nothing to hand on (a subclass of it may have something)
        self._hand_on = type(inner) not in loaded_types("profilers", "PassThroughProfiler")
        # the user's profiler's own profile(), where its class has one: each hook goes through it
        self._inner_profile: Any = inner.profile if self._hand_on and _overrides_profile(inner) else None
        self.callback_kinds = callback_kinds
        self._stack: list[list[Any]] = []
        self._started: dict[str, list[Any]] = {}  # the entries start() pushed that are still open, by name
        self._name = ""
        self._current: dict[str, float] = {_DROPPED: 1.0}  # what runs before the first batch is no step
        self._closed: dict[str, float] = {}  # the batch that ended last, for the step clock's drop_closed
        self._batches: list[dict[str, float]] = []  # the batches since the last window, kept or not
        self.window_seconds: dict[str, float] = {}  # summed by take_window
        self.total_seconds: dict[str, float] = {}
        self.total_batches = 0  # the batches kept, each counted by its weight
        self.timed_batches = 0  # the batches kept, each once: the steps whose hooks were timed
        self.timing = True  # whether this batch's hooks are timed (see the module docstring)
        self.sampled = False  # whether any batch was left untimed
        self._seen = 0  # batch boundaries so far
        self._untimed = _Untimed()
        self._untimed_batch: dict[str, float] = {_DROPPED: 1.0}  # the open batch while it is not timed
        self._random = random.Random(FULL_STEPS).random  # seeded: the same fit samples the same batches
        self.suspended = False  # the callback's own logging: neither the loggers' nor a step's
        self._recording = (
            False  # a profiler runs: each hook is also a span of the trace, as Lightning names it
        )

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        # isinstance(trainer.profiler, <the user's profiler's class>) holds during the fit, as it does for a
        # unittest.mock spec: isinstance falls back on __class__ (type() still says HookProfiler)
        return type(self.inner)

    # -- Lightning's Profiler interface -------------------------------------------------------------------

    def profile(self, action_name: str) -> Any:
        if self.timing:
            self._name = action_name  # __enter__ follows at once: Lightning runs one hook at a time
            return self
        if self._hand_on:
            return self.inner.profile(action_name)  # the user's profiler's own, as Lightning would call it
        untimed = self._untimed
        untimed.name = action_name
        return untimed

    def __enter__(self) -> Any:
        name = self._name
        if self._hand_on:
            # the user's profiler first: where it raises, Lightning's would have raised before the hook ran
            if self._inner_profile is not None:
                return self._enter_users_profile(name)
            self.inner.start(name)
        self._stack.append(
            [name, perf_counter(), 0.0, _enter_span(name, None) if self._recording else None, None]
        )
        return name  # what Lightning's Profiler.profile binds

    def _enter_users_profile(self, name: str) -> Any:
        context = self._inner_profile(name)
        bound = context.__enter__()
        span = _enter_span(name, None) if self._recording else None
        self._stack.append([name, perf_counter(), 0.0, span, context])
        return bound

    def __exit__(self, exc_type: Any = None, exc: Any = None, tb: Any = None) -> Any:
        stack = self._stack
        try:
            entry = stack.pop()
        except IndexError:  # no entry of this `with` (never seen): nothing to close, nothing to hand on
            return None
        name, started, inside, span, context = entry
        took = perf_counter() - started
        if span is not None:
            if span is _STARTED:  # start()s left open inside this `with`: they end with it, then it ends
                stack.append(entry)
                while stack and stack[-1][3] is _STARTED:
                    self._unstart(len(stack) - 1)
                return self.__exit__(exc_type, exc, tb)
            _exit_span(span)
        current = self._current
        current[name] = current.get(name, 0.0) + took - inside
        if stack:
            stack[-1][2] += took
        if self._hand_on:
            if context is None:
                self.inner.stop(name)
            elif context is not _OURS:
                return context.__exit__(exc_type, exc, tb)  # True where the user's profile() swallows exc
        return None

    def start(self, action_name: str) -> None:
        # Lightning's start/stop pairs: the fetch and the manual optimizer step. No span of the trace for them:
        # one around the DataLoader's own would hide it from torch-tb-profiler's DataLoader share
        if self._hand_on:
            self.inner.start(action_name)
        if not self.timing:  # nothing of ours is open on an untimed batch: its stop() finds no entry
            return
        started = self._started
        if started:  # the same name started again without a stop, or too many left open: the old one ends
            old = started.get(action_name)
            if old is not None or len(started) >= MAX_OPEN_STARTS:
                self._unstart(self._index_of(old if old is not None else next(iter(started.values()))))
        entry = [action_name, perf_counter(), 0.0, _STARTED, None]
        started[action_name] = entry
        self._stack.append(entry)

    def stop(self, action_name: str) -> None:
        entry = self._started.pop(action_name, None)
        if entry is not None:
            stack = self._stack
            if stack[-1] is entry:  # Lightning's pairs: what opened inside has closed
                stack.pop()
                took = perf_counter() - entry[1]
                current = self._current
                current[action_name] = current.get(action_name, 0.0) + took - entry[2]
                if stack:
                    stack[-1][2] += took
            else:  # stopped inside a `with` opened after it: it crosses that one, and ends as a left-open one
                self._unstart(self._index_of(entry))
        if self._hand_on:
            self.inner.stop(action_name)

    def _unstart(self, index: int) -> None:
        """End the start()ed entry at ``index`` as no span: it was left open past the ``with`` around it (or
        crosses one). Its own time stays with the entry below it, as if it had never started; the time of what
        closed inside it counts as inside that entry. Its name keeps no time, but its hooks keep theirs."""
        stack = self._stack
        entry = stack.pop(index)
        if index > 0:
            stack[index - 1][2] += entry[2]
        name = entry[0]
        if self._started.get(name) is entry:
            del self._started[name]

    def _index_of(self, entry: list[Any]) -> int:
        stack = self._stack
        index = len(stack) - 1
        while stack[index] is not entry:  # every open start()ed entry is on the stack
            index -= 1
        return index

    def __getattr__(self, name: str) -> Any:
        # everything else (describe, summary, setup, teardown, dirpath, ...) is the user's profiler's
        return getattr(self.inner, name)

    # -- the step clock's events ----------------------------------------------------------------------------

    def next_batch(self) -> None:
        """A batch boundary, on the step's clock: a swap, and whether the new batch's hooks are timed; which
        batches count is decided off the clock, in :meth:`take_window`. An empty batch (no hook ran) is no batch
        and costs no new dict."""
        current: dict[str, float] | None = self._current
        if current is self._untimed_batch:
            self._closed, current = current, None  # dropped already
        elif current:
            self._batches.append(current)
            self._closed, current = current, None
        else:
            self._closed = {}  # nothing ran in it: nothing of it to drop
        self._seen += 1
        # what is open across the boundary ("run_training_epoch", a start() left open) closes through its own
        # entry whatever the new batch is: an untimed batch pushes nothing onto the stack
        if self._seen <= FULL_STEPS or self._recording:
            self.timing = True
            if current is None:
                self._current = {}
        elif self._random() * SAMPLE_EVERY < 1.0:
            self.timing = True
            self._current = {_WEIGHT: SAMPLE_EVERY}
        else:
            self.timing, self.sampled = False, True
            self._current = self._untimed_batch

    @property
    def recording(self) -> bool:
        return self._recording

    @recording.setter
    def recording(self, on: bool) -> None:
        """A profiler starts (at a batch boundary) or stops recording: while it records, every batch is timed,
        each once (it would be, whatever the draw), so its hooks are spans of the trace."""
        self._recording = on
        if on:
            self.timing = True
            current = self._current
            if current is self._untimed_batch:
                self._current = {}
            else:
                current.pop(_WEIGHT, None)

    def drop_batch(self) -> None:
        """The open batch is no step of the step clock's (the epoch's first fetch, a compilation, the FLOP count)."""
        self._current[_DROPPED] = 1.0

    def drop_closed(self) -> None:
        """The batch that ended last was no step after all (the step clock closed it with no time)."""
        self._closed[_DROPPED] = 1.0

    def interrupted(self) -> None:
        """The step clock ended the step here (validation, a checkpoint, the epoch's end): what runs until the
        next batch boundary is no step's."""
        if _DROPPED not in self._current:
            self.next_batch()
            self._current = {_DROPPED: 1.0}

    def exclude(self, seconds: float) -> None:
        """The callback's own work inside the open step, left out of the step's time."""
        current = self._current
        current[anatomy.EXCLUDED] = current.get(anatomy.EXCLUDED, 0.0) + seconds

    def take_window(self) -> tuple[dict[str, float], int]:
        """The seconds per name of the batches kept since the last call, and how many batches they stand for
        (a sampled batch's seconds and count are weighted: see the module docstring)."""
        # a batch the step clock timed no step of is dropped, and so is what ran after a step's end until the next
        # batch (validation, the epoch's end) and before the fit's first batch
        kept = [b for b in self._batches if _DROPPED not in b]
        self._batches = []
        seconds: dict[str, float] = {}
        batches = 0
        for batch in kept:
            weight = batch.pop(_WEIGHT, 1)
            if weight == 1:
                anatomy.merge(seconds, batch)
            else:
                for name, took in batch.items():
                    seconds[name] = seconds.get(name, 0.0) + took * weight
            batches += int(weight)
        anatomy.merge(self.total_seconds, seconds)
        self.total_batches += batches
        self.timed_batches += len(kept)
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
            if self.suspended or not self.timing:
                return original(*args, **kwargs)
            # not handed on: Lightning does not time the loggers, so the user's profiler never sees these names
            span = _enter_span(name, None) if self._recording else None
            self._stack.append([name, perf_counter(), 0.0, span, _OURS])
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
    """The whole fit's parts (the last batch kept, the last window summed), over the steps whose hooks were timed
    (``steps``; ``sample_every`` says whether those past the first :data:`FULL_STEPS` were sampled)."""
    hooks.next_batch()
    hooks.take_window()
    found = anatomy.anatomy(
        hooks.total_seconds, hooks.total_batches, step_ms or 0.0, data_wait_ms, hooks.callback_kinds
    )
    if found is not None:
        found.steps = hooks.timed_batches
        found.sample_every = SAMPLE_EVERY if hooks.sampled else 1
    return found


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
