"""Per-rank figures brought together under DDP, without ever leaving a rank blocked in a collective of ours.

Every rank measures; each logging window and at the end of fit the ranks exchange a fixed-size vector of
their figures with ``all_gather`` on a gloo process group of our own (CPU tensors, whatever the training
backend) created with a bounded timeout. Each vector carries what it is (window or final) and a sequence
number, so ranks that fell out of step (uneven batch counts) are detected instead of mixed up; a gather that
times out or fails turns the cross-rank figures off with one warning, and training goes on.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping, Sequence

import torch

from lightning_perf import console
from lightning_perf.analysis import metrics
from lightning_perf.analysis.summary import RankStats, RunSummary

STEP_TIME_MS = metrics.STEP_TIME.tag
DATA_WAIT_MS = metrics.DATA_WAIT.tag
GPU_UTIL = metrics.GPU_UTIL.tag
CPU_UTIL = metrics.CPU_UTIL.tag

log = console.logger(__name__)

# the figures exchanged (absent ones travel as NaN and stay absent)
REDUCED_KEYS = tuple(m.tag for m in metrics.ACROSS_RANKS)
WINDOW, FINAL = 1.0, 2.0
# How long a rank waits for the others in one of our gathers. Ranks in lockstep arrive within a step of each
# other; a rank that never comes (it raised, or an IterableDataset ran out early) releases the rest after this.
GATHER_TIMEOUT_S = 60.0
SLOWEST_RANK = metrics.SLOWEST_RANK.tag


class RankReducer:
    """Exchanges per-rank figures; a no-op for a single process. Create it on every rank (it is collective)."""

    def __init__(self, timeout_s: float = GATHER_TIMEOUT_S) -> None:
        dist = torch.distributed
        #: several processes train together; stays True after a failure (``failed`` says that)
        self.distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        self.rank = dist.get_rank() if self.distributed else 0
        self.world_size = dist.get_world_size() if self.distributed else 1
        self.failed = False
        self.hosts: list[str] = []
        self.node_ranks: list[int | None] = []
        self._group = None
        self._sequence = 0
        if self.distributed:
            try:
                self._group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
            except Exception as err:
                self._disable(f"could not create a gloo group for cross-rank figures: {err}")

    def gather_hosts(self, host: str, node_rank: int | None = None) -> list[str]:
        """Every rank's host name (and node rank, into ``node_ranks``), by global rank (collective)."""
        if not self.distributed or self.failed:
            self.hosts = [host] * self.world_size
            self.node_ranks = [node_rank] * self.world_size
            return self.hosts
        try:
            pairs: list[tuple[str, int | None] | None] = [None] * self.world_size
            torch.distributed.all_gather_object(pairs, (host, node_rank), group=self._group)
            self.hosts = [str(pair[0]) if pair else "?" for pair in pairs]
            self.node_ranks = [pair[1] if pair else None for pair in pairs]
        except Exception as err:
            self._disable(f"host exchange failed: {err}")
            self.hosts = [host]
            self.node_ranks = [node_rank]
        return self.hosts

    def check_batch_counts(self, batches_per_epoch: float) -> None:
        """Turn cross-rank figures off up front when the ranks' epochs have different lengths (collective).

        Ranks then reach their windows and the end of training at different batches. Lightning itself
        broadcasts on every batch (its SIGTERM check), so a rank that finished first would wait in our gather
        for a rank that waits in Lightning's broadcast: better to know before the first gather.
        """
        if not self.distributed or self.failed:
            return
        local = torch.tensor([float(batches_per_epoch)], dtype=torch.float64)
        gathered = [torch.empty_like(local) for _ in range(self.world_size)]
        try:
            torch.distributed.all_gather(gathered, local, group=self._group)
        except Exception as err:
            self._disable(f"batch count exchange failed: {err}")
            return
        counts = [t.item() for t in gathered]
        if len(set(counts)) > 1:
            shown = ", ".join(f"rank {r}: {c:g}" for r, c in enumerate(counts))
            self._disable(f"ranks have different numbers of batches per epoch ({shown})")

    def gather(self, kind: float, values: Mapping[str, float]) -> list[dict[str, float]] | None:
        """Every rank's ``values`` (by global rank), or None when the ranks are out of step or it failed."""
        if not self.distributed:
            return [dict(values)]
        if self.failed:
            return None
        self._sequence += 1
        row = [kind, float(self._sequence)] + [float(values.get(key, math.nan)) for key in REDUCED_KEYS]
        local = torch.tensor(row, dtype=torch.float64)
        gathered = [torch.empty_like(local) for _ in range(self.world_size)]
        try:
            torch.distributed.all_gather(gathered, local, group=self._group)
        except Exception as err:
            self._disable(f"a cross-rank gather failed or timed out ({err})")
            return None
        rows = [t.tolist() for t in gathered]
        if any(r[0] != kind or r[1] != self._sequence for r in rows):
            self._disable("ranks reached different numbers of logging windows (uneven batch counts)")
            return None
        return [
            {key: value for key, value in zip(REDUCED_KEYS, r[2:], strict=True) if not math.isnan(value)}
            for r in rows
        ]

    def share(self, code: int) -> int:
        """Rank zero's ``code`` on every rank (collective: call on every rank); 0 after a failure."""
        if not self.distributed:
            return code
        if self.failed:
            return 0
        value = torch.tensor([float(code)], dtype=torch.float64)
        try:
            torch.distributed.broadcast(value, src=0, group=self._group)
        except Exception as err:
            self._disable(f"a cross-rank broadcast failed or timed out ({err})")
            return 0
        return int(value.item())

    def close(self) -> None:
        """Destroy our gloo group now that the fit is over (every rank calls it from teardown; not collective).

        A gloo group left to the interpreter's exit can abort the process ("terminate called without an active
        exception", pytorch/pytorch#190489): its worker threads still hold the last collective's work while
        Python is finalised. Further gathers answer None, as after a failure, without a warning."""
        group, self._group = self._group, None
        self.failed = self.failed or self.distributed
        if group is None:
            return
        try:
            torch.distributed.destroy_process_group(group)
        except Exception as err:  # the default group already gone (a user destroyed it): nothing left to free
            log.debug(f"lightning-perf: destroying the cross-rank group: {err}")

    def _disable(self, reason: str) -> None:
        # from now on gather() answers None: no cross-rank figures rather than one rank's as everyone's
        if not self.failed:
            log.warning(f"lightning-perf: cross-rank figures are off for this run: {reason}")
        self.failed = True


def reduce_window(per_rank: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Mean over ranks under the usual tags, the max as ``<tag>_max``, and the slowest rank."""
    reduced: dict[str, float] = {}
    for key in REDUCED_KEYS:
        values = [r[key] for r in per_rank if key in r]
        if not values:
            continue
        reduced[key] = sum(values) / len(values)
        reduced[key + metrics.MAX_SUFFIX] = max(values)
    slowest = slowest_rank(per_rank)
    if slowest is not None:
        reduced[SLOWEST_RANK] = float(slowest)
    return reduced


def slowest_rank(per_rank: Sequence[Mapping[str, float]]) -> int | None:
    """The rank holding the others back. Gradient sync evens step times out across ranks (the fast ones wait
    inside backward), so the DataLoader wait, which happens before the sync, names the culprit; step time
    breaks ties."""
    candidates = [
        (r.get(DATA_WAIT_MS, 0.0), r.get(STEP_TIME_MS, 0.0), rank)
        for rank, r in enumerate(per_rank)
        if DATA_WAIT_MS in r or STEP_TIME_MS in r
    ]
    if not candidates:
        return None
    return max(candidates)[2]


def own_figures(summary: RunSummary) -> dict[str, float]:
    """This rank's run figures for the per-rank table."""
    timing, utilization = summary.timing, summary.utilization
    figures = {
        STEP_TIME_MS: timing.step_time_ms and timing.step_time_ms.median,
        DATA_WAIT_MS: timing.data_wait_ms and timing.data_wait_ms.median,
        GPU_UTIL: utilization.gpu and utilization.gpu.util_pct,
        CPU_UTIL: utilization.cpu and utilization.cpu.process_cpu_pct,
    }
    return {key: float(value) for key, value in figures.items() if value is not None}


def rank_table(reducer: RankReducer, summary: RunSummary) -> list[RankStats]:
    """The per-rank table of the run summary (collective: call on every rank at the end of fit)."""
    per_rank = reducer.gather(FINAL, own_figures(summary))
    if per_rank is None:
        return []
    hosts = reducer.hosts or ["?"] * len(per_rank)
    nodes = reducer.node_ranks
    return [
        RankStats(
            rank=rank,
            host=hosts[rank] if rank < len(hosts) else "?",
            step_time_ms=figures.get(STEP_TIME_MS),
            data_wait_ms=figures.get(DATA_WAIT_MS),
            gpu_util_pct=figures.get(GPU_UTIL),
            cpu_util_pct=figures.get(CPU_UTIL),
            node_rank=nodes[rank] if rank < len(nodes) else None,
        )
        for rank, figures in enumerate(per_rank)
    ]
