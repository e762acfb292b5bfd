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

from time import perf_counter
from typing import Any, Protocol

_LISTENER_ATTR = "_lightning_perf_listener"
_TIMED_CLASSES: dict[type, type] = {}


class FetchListener(Protocol):
    def before_fetch(self, t: float) -> None: ...

    def after_fetch(self, t_start: float, t_end: float, fetched: Any) -> None: ...

    def fetch_stopped(self) -> None: ...

    def iterator_created(self, seconds: float) -> None: ...


def _timed_class(base: type) -> type:
    cls = _TIMED_CLASSES.get(base)
    if cls is not None:
        return cls

    def __next__(self):  # noqa: N807 - the special method we time
        listener = self._lightning_perf_listener
        listener.before_fetch(perf_counter())
        # the step's clock starts after the listener's own work (profiler stepping, trace export)
        t_start = perf_counter()
        try:
            fetched = base.__next__(self)
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
    from lightning.pytorch.loops.fetchers import _DataLoaderIterDataFetcher

    return isinstance(fetcher, _DataLoaderIterDataFetcher)
