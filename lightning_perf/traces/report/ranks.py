"""The cross-rank part of ``lightning-perf report``: one row a rank (its first trace), the spread, the cross-rank
findings (:mod:`lightning_perf.analysis.rules.cross_rank`) and the ranks that stand out (slowest, fastest,
median), which are the ones a report of many ranks details by default."""

from __future__ import annotations

from typing import Any

from lightning_perf.analysis.rules.cross_rank import (
    RankRow,
    diagnose_ranks,
    find_straggler,
    waiting_ranks,
    waits,
    without_own_communication,
)
from lightning_perf.analysis.summary import Finding

# the figures compared across ranks, with their labels
SPREAD_FIGURES = {
    "step_ms": "step ms",
    "kernel_busy_pct": "kernel-busy %",
    "step_idle_pct": "GPU idle %",
    "exposed_communication_ms_per_step": "exposed comm ms",
    "blocking_ms_per_step": "blocking ms",
    "dataloader_pct": "DataLoader %",
}
# Above this many ranks the text report leads with the cross-rank view and details only the ranks that stand out.
# Our choice: up to 4 ranks (one node of 4 GPUs, or 2 x 2) every rank's details still fit a screen or two.
MANY_RANKS = 4


def _share(figures: dict[str, Any], pct_key: str) -> float | None:
    pct, step = figures.get(pct_key), figures.get("step_ms")
    return None if pct is None or step is None else pct * step / 100.0


def rank_row(section: dict[str, Any]) -> RankRow:
    """A trace section of the report as a cross-rank row (ms a step)."""
    fig = section["figures"]
    return RankRow(
        rank=section["rank"],
        step_ms=fig.get("step_ms"),
        dataloader_ms=_share(fig, "dataloader_pct"),
        kernel_ms=_share(fig, "compute_busy_pct"),
        blocking_ms=fig.get("blocking_ms_per_step"),
        exposed_comm_ms=fig.get("exposed_communication_ms_per_step"),
        idle_ms=_share(fig, "step_idle_pct"),
        backend=section.get("backend"),
    )


def rank_spread(sections: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Per rank (first trace of each, sorted by rank), the figures of SPREAD_FIGURES, their spread (max - min),
    the cross-rank findings and the ranks that stand out; None unless the traces come from two ranks or more.

    The sections of ranks that wait for a straggler lose the ``exposed_communication`` finding for that wait
    (:func:`~lightning_perf.analysis.rules.cross_rank.without_own_communication`)."""
    by_rank: dict[int, dict[str, Any]] = {}
    for section in sections:
        if section["rank"] is not None and section["rank"] not in by_rank:
            by_rank[section["rank"]] = section
    if len(by_rank) < 2:
        return None
    rows = [{"rank": r, **{k: by_rank[r]["figures"].get(k) for k in SPREAD_FIGURES}} for r in sorted(by_rank)]
    spread = {}
    for key in SPREAD_FIGURES:
        values = [row[key] for row in rows if row[key] is not None]
        spread[key] = round(max(values) - min(values), 3) if values else None
    rank_rows = [rank_row(by_rank[r]) for r in sorted(by_rank)]
    findings = diagnose_ranks(rank_rows)
    waiting = waiting_ranks(rank_rows)
    found = find_straggler(rank_rows)
    if found is not None:
        for section in sections:
            if section["rank"] in waiting:
                kept = without_own_communication(
                    [Finding(**f) for f in section["findings"]],
                    rank_row(section),
                    waiting[section["rank"]],
                    found.rank,
                )
                section["findings"] = [_finding_dict(f) for f in kept]
    return {
        "rows": rows,
        "spread": spread,
        "findings": [_finding_dict(f) for f in findings],
        "straggler": found.rank if found is not None else None,
        "waiting": sorted(waiting),
        "standout": standout(rank_rows, found.rank if found is not None else None),
    }


def standout(rows: list[RankRow], straggler: int | None) -> dict[str, int]:
    """The slowest (the straggler when there is one), fastest and median rank by busy time (step less the wait
    for others, which separates ranks that collectives hold in lockstep), each once."""
    known = [r for r in rows if r.step_ms is not None]
    if not known:
        return {}
    wait = waits(known)
    ordered = sorted(known, key=lambda r: (r.step_ms - wait[r.rank], r.rank))  # type: ignore[operator]
    picks = {
        "slowest": straggler if straggler is not None else ordered[-1].rank,
        "fastest": ordered[0].rank,
        "median": ordered[(len(ordered) - 1) // 2].rank,
    }
    out: dict[str, int] = {}
    for role, rank in picks.items():
        if rank not in out.values():
            out[role] = rank
    return out


def detailed_ranks(
    report: dict[str, Any], chosen: list[int] | None = None, every: bool = False
) -> set[int] | None:
    """The ranks whose traces a text report details: None for all (``every``, at most MANY_RANKS ranks, or no
    cross-rank view), else the ranks that stand out and those ``chosen``."""
    ranks = report.get("ranks")
    if every or not ranks or len(ranks["rows"]) <= MANY_RANKS:
        return None
    return set(ranks.get("standout", {}).values()) | set(chosen or [])


def _finding_dict(finding: Finding) -> dict[str, Any]:
    keys = ("id", "severity", "title", "evidence", "recommendation", "settings_change")
    return {key: getattr(finding, key) for key in keys}
