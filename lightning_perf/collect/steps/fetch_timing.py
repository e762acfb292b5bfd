"""Timing the training loop's own ``next(data_fetcher)`` call.

Lightning's loops fetch every batch with ``next(data_fetcher)`` (``loops/fetchers.py``). That call is exactly
what the loop blocks on: the DataLoader (and, for an ``IterableDataset``, Lightning's one-batch prefetch),
nothing else — not the host-to-device copy, not other callbacks, not logging. Hooks cannot see it (the gap
between ``on_train_batch_end`` and the next ``on_train_batch_start`` also holds logging, validation and
checkpoints), so we swap the fetcher instance's class for a subclass whose ``__next__``/``__iter__`` report to
a listener. The swap touches one object for one run and is undone at the end; Lightning's own
``isinstance`` checks still hold.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from time import perf_counter
from typing import Any, Protocol

from lightning_perf.collect.namespaces import is_instance, lightning_version

_LISTENER_ATTR = "_lightning_perf_listener"
_TIMED_CLASSES: dict[type, type] = {}


class FetchListener(Protocol):
    def before_fetch(self, t: float) -> bool: ...

    def after_fetch(self, t_start: float, t_end: float, fetched: Any) -> None: ...

    def fetch_stopped(self) -> None: ...

    def iterator_created(self, seconds: float) -> None: ...


def _timed_class(base: type[Iterator[Any]]) -> type:
    cls = _TIMED_CLASSES.get(base)
    if cls is not None:
        return cls

    base_next = base.__next__  # bound once: this runs on every batch

    def __next__(self):  # noqa: N807 - the special method we time
        listener = self._lightning_perf_listener
        t_start = perf_counter()
        if listener.before_fetch(t_start):
            # the step's clock starts after the listener's own work (profiler stepping, trace export)
            t_start = perf_counter()
        try:
            fetched = base_next(self)
        except StopIteration:
            listener.fetch_stopped()
            raise
        listener.after_fetch(t_start, perf_counter(), fetched)
        return fetched

    def __iter__(self):  # noqa: N807
        t_start = perf_counter()
        result = base.__iter__(self)
        self._lightning_perf_listener.iterator_created(perf_counter() - t_start)
        return result

    cls = type(f"Timed{base.__name__}", (base,), {"__next__": __next__, "__iter__": __iter__})
    _TIMED_CLASSES[base] = cls
    return cls


def instrument(fetcher: Any, listener: FetchListener) -> bool:
    """Route ``fetcher``'s ``__next__``/``__iter__`` through ``listener``; False if it cannot be done."""
    if fetcher is None:
        return False
    if is_instrumented(fetcher):
        setattr(fetcher, _LISTENER_ATTR, listener)
        return True
    try:
        timed = _timed_class(type(fetcher))
        setattr(fetcher, _LISTENER_ATTR, listener)
        fetcher.__class__ = timed
    except TypeError:  # an exotic fetcher whose layout does not allow the swap
        return False
    return True


def uninstrument(fetcher: Any) -> None:
    if fetcher is None or not is_instrumented(fetcher):
        return
    fetcher.__class__ = type(fetcher).__bases__[0]
    fetcher.__dict__.pop(_LISTENER_ATTR, None)


def is_instrumented(fetcher: Any) -> bool:
    return type(fetcher) in _TIMED_CLASSES.values()


def fetches_inside_step(fetcher: Any) -> bool:
    """True when ``training_step`` takes ``dataloader_iter`` and fetches its own batches."""
    return is_instance(fetcher, "loops.fetchers", "_DataLoaderIterDataFetcher")


def loop_fetcher(loop: Any) -> Any:
    """The loop's data fetcher (a private attribute of Lightning's loops), or None where a version lacks it."""
    return getattr(loop, "_data_fetcher", None)


class HookTiming:
    """The fallback where the loop's fetcher cannot be timed (a Lightning version without
    ``<loop>._data_fetcher``, or a fetcher whose class cannot be swapped): batch boundaries come from the public
    ``on_train_batch_start`` hook instead. Step time, throughput and the profiling schedule still work; the
    DataLoader wait, compute time and epoch start-up are not observable there (the hook runs after the fetch
    and the host-to-device copy), so they are not reported. One warning says so.
    """

    def __init__(self, listener: FetchListener) -> None:
        self.listener = listener

    def batch_started(self, batch: Any) -> None:
        t = perf_counter()
        self.listener.before_fetch(t)
        self.listener.after_fetch(t, t, batch)

    @staticmethod
    def warn(trainer: Any, stage: str, loop_name: str) -> None:
        if stage == "fit":
            instead = "batch boundaries come from on_train_batch_start. Lost: DataLoader wait, compute time "
            instead += "and epoch start-up time (step time, throughput, utilization and traces still work)."
        else:
            instead = f"its batches are not timed. Lost: the {stage} run's step figures and traces."
        warnings.warn(
            f"lightning-perf: the {stage} loop of Lightning {lightning_version(trainer)} has no data fetcher "
            f"that can be timed (`trainer.{loop_name}._data_fetcher`); {instead}",
            stacklevel=3,
        )
