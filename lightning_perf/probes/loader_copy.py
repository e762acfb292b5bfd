"""Throw-away copies of the user's DataLoader for the probes that time it (:mod:`lightning_perf.probes.num_workers`,
:mod:`lightning_perf.probes.handoff`): the same data with another worker count, its workers shut down at once, and
every random state it advances put back. Uses torch's DataLoader, nothing from Lightning.
"""

from __future__ import annotations

import contextlib
import random
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset


def copy_loader(dataloader: DataLoader, workers: int, timeout_s: float) -> DataLoader:
    """A DataLoader over the same data with ``workers`` workers; no generator, no persistent workers."""
    kwargs: dict[str, Any] = {
        "num_workers": workers,
        "collate_fn": dataloader.collate_fn,
        "pin_memory": dataloader.pin_memory,
        "worker_init_fn": dataloader.worker_init_fn,
        "persistent_workers": False,
    }
    for name in ("pin_memory_device", "in_order"):  # newer torch only
        if hasattr(dataloader, name):
            kwargs[name] = getattr(dataloader, name)
    if workers > 0:
        kwargs["timeout"] = dataloader.timeout if dataloader.timeout > 0 else timeout_s
        kwargs["multiprocessing_context"] = dataloader.multiprocessing_context
        if dataloader.prefetch_factor is not None:
            kwargs["prefetch_factor"] = dataloader.prefetch_factor
    if isinstance(dataloader.dataset, IterableDataset):
        kwargs.update(batch_size=dataloader.batch_size, drop_last=dataloader.drop_last)
    elif dataloader.batch_sampler is not None:
        kwargs["batch_sampler"] = dataloader.batch_sampler  # carries the sampler, batch size and drop_last
    else:
        kwargs.update(sampler=dataloader.sampler, batch_size=None)
    return DataLoader(dataloader.dataset, **kwargs)


def shutdown_workers(iterator: Any) -> None:
    # joins the worker processes now instead of whenever the iterator is garbage-collected
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


@contextlib.contextmanager
def preserved_random_state(dataloader: DataLoader) -> Iterator[None]:
    """Restore every RNG the probe advances: the sampler's generator, torch's, Python's and NumPy's.

    Shuffling samplers draw from their generator, each new iterator draws a worker seed from torch's
    global RNG, and with 0 workers the dataset's transforms run here and draw from the global RNGs.
    """
    generators = {}
    for owner in (dataloader, dataloader.sampler, getattr(dataloader.batch_sampler, "sampler", None)):
        generator = getattr(owner, "generator", None)
        if isinstance(generator, torch.Generator):
            generators[id(generator)] = (generator, generator.get_state())
    torch_state, python_state = torch.get_rng_state(), random.getstate()
    numpy = sys.modules.get("numpy")  # only if the program uses it; never imported here
    numpy_state = numpy.random.get_state() if numpy is not None else None
    try:
        yield
    finally:
        for generator, state in generators.values():
            generator.set_state(state)
        torch.set_rng_state(torch_state)
        random.setstate(python_state)
        if numpy is not None:
            numpy.random.set_state(numpy_state)
