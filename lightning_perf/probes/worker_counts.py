"""Which ``num_workers`` values the probe tries: 0, 1, 2, 4, ... up to the usable cores, and past them when the
caller measured that the loading waits (waiting workers sleep, they do not compete for cores), as far as the
free memory holds. Used by :mod:`lightning_perf.probes.num_workers`.
"""

from __future__ import annotations

import psutil

from lightning_perf.collect.sampling.utilization import usable_cpu_count

# Loading that waits (storage, network, sleep: CPU time well below wall time) leaves the cores idle, so workers
# that sleep do not compete for them and the candidates go past the usable cores, up to
# waiting_workers_max(cores) = max(WAITING_WORKERS_MIN, WAITING_WORKERS_PER_CORE x cores), at most
# WAITING_WORKERS_MAX. Our choices: a worker that waits most of its time uses a quarter of a core or less, so 4 a
# core; at least 8, so even a 2-core machine keeps several requests in flight to hide their latency; at most 32,
# since each worker is a process holding its own dataset copy and prefetch_factor batches, and each doubling
# is one more candidate sharing the budget.
WAITING_WORKERS_PER_CORE = 4
WAITING_WORKERS_MIN = 8
WAITING_WORKERS_MAX = 32
# Memory bound on those candidates: a worker's resident memory as a share of the training process's RSS. An
# estimate, not a measurement: forked workers share the trainer's pages until they write them, and on typical
# datasets a worker's own resident set stays at most about half the trainer's (the model, optimizer state and
# CUDA context stay in the trainer). Candidate counts stop where count x this x RSS exceeds the available memory.
WORKER_RSS_SHARE = 0.5


def waiting_workers_max(cores: int) -> int:
    """The largest ``num_workers`` tried for loading that waits on ``cores`` usable cores (see the constants)."""
    return min(WAITING_WORKERS_MAX, max(WAITING_WORKERS_MIN, WAITING_WORKERS_PER_CORE * cores))


def probe_counts(max_workers: int | None = None, loading_waits: bool = False) -> tuple[list[int], str]:
    """The ``num_workers`` values to try, and a note when memory cut them short ("" otherwise).

    ``max_workers`` given: :func:`candidate_counts` up to it. Otherwise up to the usable cores, and with
    ``loading_waits`` past them up to :func:`waiting_workers_max`, stopping at the first count whose workers
    would not fit the available memory (each estimated at ``WORKER_RSS_SHARE`` of this process's RSS; when
    memory cannot be read the counts stay at the cores).
    """
    if max_workers is not None:
        return candidate_counts(max_workers), ""
    cores = usable_cpu_count()
    counts = candidate_counts(cores)
    if not loading_waits:
        return counts, ""
    beyond = [n for n in candidate_counts(waiting_workers_max(cores)) if n > cores]
    if not beyond:
        return counts, ""
    try:
        available = float(psutil.virtual_memory().available)
        per_worker = WORKER_RSS_SHARE * float(psutil.Process().memory_info().rss)
    except Exception as err:  # /proc unreadable: no memory bound to trust, so no candidates past the cores
        return (
            counts,
            f"memory could not be read ({type(err).__name__}), so candidates stop at the {cores} cores",
        )
    for workers in beyond:
        if available < workers * per_worker:
            return counts, (
                f"candidates stop before num_workers={workers}: that many workers would take about "
                f"{workers * per_worker / 2**30:.1f} GiB (each an estimated {WORKER_RSS_SHARE:g}x this "
                f"process's resident memory), more than the {available / 2**30:.1f} GiB available"
            )
        counts.append(workers)
    return counts, ""


def candidate_counts(max_workers: int) -> list[int]:
    """0, 1, 2, 4, ... doubling up to ``max_workers``, which is always included."""
    counts, workers = [0], 1
    while workers <= max_workers:
        counts.append(workers)
        workers *= 2
    if counts[-1] != max_workers:
        counts.append(max_workers)
    return counts
