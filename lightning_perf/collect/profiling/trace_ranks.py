"""Which ranks record torch profiler traces: the ``trace_ranks`` policy, one small pure function.

Every rank times its steps, samples utilization and joins the cross-rank exchange; only the ranks chosen here
create a torch profiler and write traces. ``"auto"`` keeps small jobs whole (every rank up to
:data:`AUTO_ALL_RANKS`) and, above that, the ranks that tell a cluster's story: rank 0, the first rank of each
node (one trace per machine shows a node's own input pipeline and interconnect) and the last rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_perf.errors import ConfigError

TRACE_RANK_MODES = ("auto", "all")
# Up to this many ranks "auto" traces every rank: 8 is one node of 8 GPUs (a DGX/HGX box), where a trace per
# rank is still a folder one can open, and the ranks of one node share the same input pipeline and NVLink.
AUTO_ALL_RANKS = 8
_ALLOWED = '"auto", "all", or a non-empty list of global ranks (integers >= 0)'


def validate(setting: Any) -> str | tuple[int, ...]:
    """``setting`` checked and normalised: ``"auto"``, ``"all"`` or a sorted tuple of distinct ranks."""
    if isinstance(setting, str):
        if setting.lower() in TRACE_RANK_MODES:
            return setting.lower()
        raise ConfigError(f"`trace_ranks` must be {_ALLOWED}, got {setting!r}")
    if isinstance(setting, int) and not isinstance(setting, bool):
        setting = [setting]
    if not isinstance(setting, (list, tuple)) or not setting:
        raise ConfigError(f"`trace_ranks` must be {_ALLOWED}, got {setting!r}")
    for rank in setting:
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ConfigError(f"`trace_ranks` entry {rank!r} is not a global rank (an integer >= 0)")
    return tuple(sorted(set(setting)))


def ranks_to_trace(world_size: int, ranks_per_node: int | Sequence[int], setting: Any = "auto") -> set[int]:
    """The global ranks that record traces in a job of ``world_size`` ranks.

    ``ranks_per_node``: the number of ranks on every node (Lightning's ``devices``; global rank
    ``node * ranks_per_node + local_rank``), or the first global rank of each node for uneven layouts.
    A listed rank that does not exist in the job is an error naming it (the job would record nothing there).
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world_size must be an integer >= 1, got {world_size!r}")
    setting = validate(setting)
    everyone = set(range(world_size))
    if setting == "all" or (setting == "auto" and world_size <= AUTO_ALL_RANKS):
        return everyone
    if setting == "auto":
        return {0, world_size - 1} | (set(node_starts(world_size, ranks_per_node)) & everyone)
    missing = [rank for rank in setting if rank >= world_size]
    if missing:
        raise ConfigError(
            f"`trace_ranks` names rank(s) {', '.join(map(str, missing))}, but this job has {world_size} "
            f"rank(s) (0-{world_size - 1}); list ranks below {world_size}, or use 'auto' or 'all'"
        )
    return set(setting)


def node_starts(world_size: int, ranks_per_node: int | Sequence[int]) -> list[int]:
    """The first global rank of each node."""
    if isinstance(ranks_per_node, int):
        if isinstance(ranks_per_node, bool) or ranks_per_node < 1:
            raise ConfigError(f"ranks_per_node must be >= 1, got {ranks_per_node}")
        return list(range(0, world_size, ranks_per_node))
    starts = sorted({int(rank) for rank in ranks_per_node} | {0})
    return [rank for rank in starts if 0 <= rank < world_size]


def describe(ranks: set[int] | Sequence[int], world_size: int) -> str:
    """``"ranks 0, 7-8, 15 of 16"``: consecutive ranks as ranges, for warnings and logs."""
    ordered = sorted(ranks)
    if len(ordered) == world_size:
        return f"all {world_size} ranks" if world_size > 1 else "rank 0"
    parts: list[str] = []
    start = prev = None
    for rank in [*ordered, None]:
        if rank is not None and prev is not None and rank == prev + 1:
            prev = rank
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = rank
    noun = "rank" if len(ordered) == 1 else "ranks"
    return f"{noun} {', '.join(parts)} of {world_size}"
