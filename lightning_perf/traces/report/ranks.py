"""The cross-rank part of ``lightning-perf report``: one row a rank (its first trace), the spread, the cross-rank
findings (:mod:`lightning_perf.analysis.rules.cross_rank`) and the ranks that stand out, which are the ones a
report of many ranks details by default. Each label a rank gets names the table column it is read from
(``standout_by``): slowest, fastest and median by "non-comm ms" (its step less its exposed communication),
"waited for" (the rank the others wait for in collectives: the least "exposed comm ms"), "waits most" by
"wait ms" (its exposed communication above that rank's)."""

from __future__ import annotations

from typing import Any

from lightning_perf.analysis.rules.cross_rank import (
    RankRow,
    Straggler,
    diagnose_ranks,
    find_straggler,
    late_ranks,
    step_ms,
    waiting_ranks,
    waits,
    without_own_communication,
)
from lightning_perf.analysis.summary import Finding

# the figures compared across ranks, with their labels
SPREAD_FIGURES = {
    "step_ms": "step ms",
    "busy_ms": "non-comm ms",  # the step less its exposed communication (the rank's own time, not waiting)
    "exposed_communication_ms_per_step": "exposed comm ms",
    "wait_ms": "wait ms",  # exposed communication above the waited-for rank's: the wait for it
    "kernel_busy_pct": "kernel-busy %",
    "compute_busy_pct": "compute %",
    "step_idle_pct": "GPU idle %",
    "blocking_ms_per_step": "blocking ms",
    # the DataLoader calls' time a step, whatever GPU work ran beside them: the DataLoader share counts exposed
    # time only, and the step alignment hides a call made under the previous step's trailing kernels (DLRM rank 1:
    # 0.0% beside rank 0's 7.5%, a spread that was an artefact)
    "dataloader_call_ms": "DataLoader ms",
}
# the columns made here from the others (not figures of a trace)
_DERIVED = ("busy_ms", "wait_ms")
# each label of a standout rank and the column that backs it
STANDOUT_BY = {
    "slowest": "non-comm ms",
    "waited_for": "exposed comm ms",
    "waits_most": "wait ms",
    "fastest": "non-comm ms",
    "median": "non-comm ms",
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
        dataloader_ms=fig.get("dataloader_call_ms", _share(fig, "dataloader_pct")),
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
    rank_rows = [rank_row(by_rank[r]) for r in sorted(by_rank)]
    found = find_straggler(rank_rows)
    busy, wait = _busy_and_wait(rank_rows, found.rank if found is not None else None)
    rows = [
        {
            "rank": r,
            **{k: by_rank[r]["figures"].get(k) for k in SPREAD_FIGURES if k not in _DERIVED},
            "busy_ms": busy.get(r),
            "wait_ms": wait.get(r),
        }
        for r in sorted(by_rank)
    ]
    spread = {}
    for key in SPREAD_FIGURES:
        values = [row[key] for row in rows if row[key] is not None]
        spread[key] = round(max(values) - min(values), 3) if values else None
    findings = diagnose_ranks(rank_rows)
    waiting = waiting_ranks(rank_rows)
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
        "waited_for": late_ranks(rank_rows),
        "standout": (picked := standout(rank_rows, _from_collectives(found))),
        "standout_by": {role: STANDOUT_BY[role] for role in picked},
    }


def _from_collectives(found: Straggler | None) -> int | None:
    """The straggler when the collectives name it (the others wait for it), else None."""
    return found.rank if found is not None and found.waited_ms is not None else None


def _busy_and_wait(rows: list[RankRow], straggler: int | None) -> tuple[dict[int, float], dict[int, float]]:
    """Per rank, ms a step: its step less its exposed communication ("non-comm ms"), and its exposed
    communication above the straggler's ("wait ms", only with a straggler and every rank's measured), 3
    decimals."""
    known = [r for r in rows if r.step_ms is not None]
    wait = waits(known)
    busy = {r.rank: round(step_ms(r) - wait[r.rank], 3) for r in known}
    if straggler is None or any(r.exposed_comm_ms is None for r in known):
        return busy, {}
    return busy, {r.rank: round(max(0.0, wait[r.rank] - wait[straggler]), 3) for r in known}


def standout(rows: list[RankRow], waited_for: int | None) -> dict[str, int]:
    """The ranks that stand out, each once, each label read from a column of the table (STANDOUT_BY): the
    slowest, fastest and median by busy time ("non-comm ms": step less the wait for others, which separates
    ranks that collectives hold in lockstep); when the collectives show a rank the others wait for
    (``waited_for``), that rank and the one that waits most for it ("wait ms")."""
    known = [r for r in rows if r.step_ms is not None]
    if not known:
        return {}
    wait = waits(known)
    busy = {r.rank: step_ms(r) - wait[r.rank] for r in known}
    ordered = sorted(known, key=lambda r: (busy[r.rank], r.rank))
    picks: dict[str, int | None] = {"slowest": ordered[-1].rank, "waited_for": waited_for, "waits_most": None}
    if waited_for is not None:
        most = max(known, key=lambda r: (wait[r.rank], -r.rank))
        picks["waits_most"] = most.rank if wait[most.rank] > wait[waited_for] else None
    picks.update(fastest=ordered[0].rank, median=ordered[(len(ordered) - 1) // 2].rank)
    out: dict[str, int] = {}
    for role, rank in picks.items():
        if rank is not None and rank not in out.values():
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
