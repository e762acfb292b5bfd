"""Many traces at once: one trace a task in a pool of processes, results in the order of the inputs.

A folder of a thousand ranks' traces is read by as many processes as the machine lets this one use
(:func:`default_jobs`; a larger ``jobs`` is capped there, and at the number of traces: :func:`capped_jobs`);
each worker holds one trace at a time (``chunksize=1``: it takes the next file when it has handed back the
result of the last), so the memory of the run is ``jobs`` traces being read plus the small
per-trace results the caller keeps, whatever the number of files. ``jobs=1`` (or a single file) runs in this
process, without a pool.

Standard library only: :mod:`concurrent.futures` is the pool (each worker keeps the memory it frees for its
next trace: :mod:`~lightning_perf.traces.read.allocator`); this module adds the error capture that lets one
unreadable file be reported while the others are read, and the argument check. A worker that dies (killed for
memory, a crash in native code) costs the file it was reading, not the others: the first file not done when
the pool broke is read again alone in a fresh process (an error if that one dies too), the rest in a fresh pool.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from lightning_perf.errors import ConfigError
from lightning_perf.processes import alive
from lightning_perf.traces.read.allocator import keep_freed_memory

T = TypeVar("T")
# how often a reading process looks whether the process that started it is still there
PARENT_CHECK_S = 1.0


def default_jobs() -> int:
    """The CPU cores this process may run on (its affinity mask, e.g. under SLURM or taskset), else all."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_jobs(jobs: int | None) -> int:
    """``jobs`` as a count of processes (None: :func:`default_jobs`); ValueError naming it when it is not an
    int >= 1."""
    if jobs is None:
        return default_jobs()
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(
            f"jobs must be an int >= 1 (processes reading traces at once) or None, got {jobs!r}"
        )
    return jobs


def capped_jobs(jobs: int | None, count: int) -> tuple[int, str | None]:
    """The processes worth starting for ``count`` traces: ``jobs`` (None: :func:`default_jobs`) capped at the
    usable cores (more processes only take turns on them, each holding a trace in memory) and at ``count`` (a
    process a trace at most); and, when an explicit ``jobs`` was capped, a line saying to what and why."""
    asked = check_jobs(jobs)
    cores = default_jobs()
    used = max(1, min(asked, cores, count))
    if jobs is None or used >= asked:
        return used, None
    limits = []
    if cores < asked:
        limits.append(
            f"the {cores} usable CPU core{'s' if cores != 1 else ''} (more processes would only take turns on "
            "them, each holding a trace in memory)"
        )
    if count < asked:
        limits.append(f"the {count} trace{'s' if count != 1 else ''} to read")
    processes = f"{used} process{'es' if used != 1 else ''}"
    return used, f"reading with {processes}, not {asked}: no more than {' and '.join(limits)}"


def _context() -> multiprocessing.context.BaseContext:
    """A fresh process a worker (forkserver where there is one, else spawn), not a fork of this one: forking a
    process that runs threads (a test runner, a notebook, a logger) can deadlock the child."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def _call(fn: Callable[[str], T], path: str, errors: tuple[type[BaseException], ...]) -> tuple[bool, Any]:
    """(True, fn(path)), or (False, the message of an expected error): a worker's result, picklable."""
    try:
        return True, fn(path)
    except errors as err:
        return False, str(err)


def map_traces(
    fn: Callable[[str], T],
    paths: Sequence[str],
    jobs: int | None = None,
    errors: tuple[type[BaseException], ...] = (),
) -> Iterator[tuple[str, bool, Any]]:
    """``(path, True, fn(path))`` or ``(path, False, error message)`` for each of ``paths``, in their order.

    ``fn`` must be picklable (a module-level function, or a functools.partial of one) when the work goes to
    processes. Exceptions of the ``errors`` types become messages; any other propagates. ``jobs``: processes
    (default: :func:`default_jobs`); never more than the usable cores nor than there are paths
    (:func:`capped_jobs`); 1 runs in this process.
    """
    jobs = capped_jobs(jobs, len(paths))[0]
    if jobs <= 1:
        for path in paths:
            yield (path, *_call(fn, path, errors))
        return
    pending = list(paths)
    while pending:
        broken = None
        # the workers are ours: they keep freed memory for the next trace (see allocator.py)
        with _pool(min(jobs, len(pending))) as pool:
            futures: list[Future[tuple[bool, Any]] | None] = [
                pool.submit(_call, fn, path, errors) for path in pending
            ]
            for index, path in enumerate(pending):
                try:
                    ok, value = futures[index].result()  # type: ignore[union-attr]
                except BrokenProcessPool:
                    broken = index
                    break
                futures[index] = None  # the caller holds the result now
                yield path, ok, value
        if broken is None:
            return
        yield (pending[broken], *_alone(fn, pending[broken], errors))
        pending = pending[broken + 1 :]


def _pool(jobs: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(
        max_workers=jobs, mp_context=_context(), initializer=_start_worker, initargs=(os.getpid(),)
    )


def _start_worker(owner: int) -> None:
    """A reading process keeps freed memory for the next trace (see allocator.py) and ends when ``owner``, the
    process whose pool it serves, is gone: a pool's idle workers wait on their queue for ever otherwise (a
    TensorBoard serving the Perf tab, stopped with its pool open, left six of ~170 MB each). Their parent is the
    forkserver, which outlives the owner, so the owner itself is watched."""
    keep_freed_memory()

    def watch() -> None:
        while alive(owner):
            time.sleep(PARENT_CHECK_S)
        os._exit(0)

    threading.Thread(target=watch, name="lightning-perf-owner-watch", daemon=True).start()


def _alone(fn: Callable[[str], T], path: str, errors: tuple[type[BaseException], ...]) -> tuple[bool, Any]:
    """``fn(path)`` in a fresh process of its own; (False, why) when that process dies too."""
    with _pool(1) as pool:
        try:
            return pool.submit(_call, fn, path, errors).result()
        except BrokenProcessPool:
            return False, f"{path}: the process reading it ended abruptly (killed for memory, or a crash)"
