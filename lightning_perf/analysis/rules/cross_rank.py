"""Cross-rank rules: the rank that holds the others back (``straggler``) and the ranks that wait for it
(``collective_wait``), over one row of figures a rank (:class:`RankRow`).

Where every rank's trace measured its exposed communication, the collectives themselves tell who is waited
for: in a collective every rank waits for the last to arrive, so that rank (the least exposed communication,
the most time outside communication) is the one the others wait for, and their exposed communication above
its own is their wait. That verdict holds whenever the wait is long enough to matter (STRAGGLER_MIN_GAP_MS and
COLLECTIVE_WAIT_MIN_PCT of a waiting rank's step), however small the last rank's lead in busy time: the 7x
spread of exposed communication across 8 DLRM ranks (11.1 against 1.6 ms a step) is such a case.

Gradient sync (DDP's all-reduce, any collective) evens the step times out: the fast ranks wait inside the
collective for the slowest, so step time alone rarely names the culprit. What a rank spends *not waiting* does:
its busy time is its step minus the time it waited for the others. From a trace that wait is the exposed
communication (communication kernels that overlap no compute). From the callback's per-rank table (no trace
figures) it is estimated as the host compute above the least of any rank: the all-reduce sits inside the
backward pass, and the rank that waits least there is the one the others wait for. Rows with neither use the
step time alone.

Pure: plain rows in, :class:`Finding` s out; imports nothing from torch, Lightning or traces.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from lightning_perf.analysis.numbers import finite, median_known
from lightning_perf.analysis.numbers import fmt1 as _fmt
from lightning_perf.analysis.rules.helpers import others
from lightning_perf.analysis.rules.thresholds import (
    SEVERITY_ORDER,
    STRAGGLER_HIGH_PCT,
    STRAGGLER_MIN_GAP_MS,
    STRAGGLER_RATIO,
)
from lightning_perf.analysis.rules.trace_thresholds import EXPOSED_COMM_HIGH_PCT, EXPOSED_COMM_MEDIUM_PCT
from lightning_perf.analysis.summary import Finding, RankStats

# A rank waits for another in a collective when that wait is at least this share of its own step: the line of
# the exposed-communication finding (torch-tb-profiler's 10%), since the wait is what that finding would report.
COLLECTIVE_WAIT_MIN_PCT = EXPOSED_COMM_MEDIUM_PCT
COLLECTIVE_WAIT_HIGH_PCT = EXPOSED_COMM_HIGH_PCT
# A part of the straggler's step is named as the cause when it explains at least this share of its lead over the
# median rank. Our choice: half, so the part named is where most of the difference is, not a side effect of it.
STRAGGLER_PART_MIN_SHARE = 0.5


@dataclass(frozen=True)
class RankRow:
    """One rank's figures, ms a step; ``None`` where not measured."""

    rank: int
    host: str | None = None
    step_ms: float | None = None
    dataloader_ms: float | None = None
    kernel_ms: float | None = None  # compute kernels on the GPU (communication kernels excluded)
    blocking_ms: float | None = None  # runtime calls that held the host until the GPU caught up
    exposed_comm_ms: float | None = None  # communication kernels overlapping no compute kernel
    idle_ms: float | None = None  # no kernel or copy on the GPU
    compute_ms: float | None = None  # host: step minus DataLoader wait (holds the wait inside collectives)
    backend: str | None = None  # the process group's backend ("nccl", "gloo"), when known


# the parts of a step that can differ, with what they are called and the fix that fits a straggler there
PARTS = {
    "dataloader_ms": (
        "DataLoader wait",
        "Give that rank's input pipeline what the others have: more DataLoader workers (`num_workers`) or cores "
        "on its host, no other processes competing for its CPU, storage as fast as the others' (a local copy "
        "rather than a slow mount), and shards of equal cost per rank.",
    ),
    "kernel_ms": (
        "GPU kernels",
        "Check that rank's GPU: clocks held down by power or temperature (`nvidia-smi -q -d PERFORMANCE`), "
        "another process sharing it, or more work on that rank (uneven sequence lengths or shapes: bucket or "
        "pad batches to the same size on every rank).",
    ),
    "blocking_ms": (
        "host-blocking calls",
        "Remove the rank-dependent syncs (`.item()`, `.cpu()`, printing or logging tensors on that rank "
        "only, e.g. under `if rank == 0`): they stall its GPU while the others wait for it.",
    ),
    "exposed_comm_ms": (
        "exposed communication",
        "Check that rank's interconnect: its network link or NIC, its place in the topology (NVLink, PCIe, "
        "across nodes); `NCCL_DEBUG=INFO` shows the transports each rank uses.",
    ),
    "idle_ms": (
        "GPU idle time (host-side work)",
        "That rank's host launches its work late: look for CPU contention on its host (other processes, "
        "fewer cores, CPU affinity) and for Python work only that rank does.",
    ),
    "compute_ms": (
        "host compute",
        "Check that rank's host and device for contention or throttling, and give every rank the same work "
        "(equal shard and batch sizes).",
    ),
}


@dataclass(frozen=True)
class Straggler:
    """The rank the others wait for, what it is busy with, and how much longer than the median rank."""

    rank: int
    busy_ms: float
    median_busy_ms: float
    lead_ms: float
    part: str | None  # key of PARTS that differs most, None when no measured part does
    part_ms: float | None
    part_median_ms: float | None
    # from the collectives (every rank's exposed communication measured): the others' wait for it, ms a step
    # (median of the ranks that wait), and the ranks that wait; None and () when found by busy time alone
    waited_ms: float | None = None
    waiting: tuple[int, ...] = ()


def step_ms(row: RankRow) -> float:
    """A row's step time; the rules read only rows that measured one (NaN otherwise: it passes no test)."""
    return row.step_ms if row.step_ms is not None else math.nan


def rank_list(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 5, 7, 8]`` -> ``"0-3, 5, 7-8"``."""
    runs: list[list[int]] = []
    for r in sorted(set(ranks)):
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return ", ".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def rows_from_stats(stats: Sequence[RankStats]) -> list[RankRow]:
    """The callback's per-rank table as rows: step time, DataLoader wait and the host compute between them."""
    rows = []
    for s in stats:
        step, wait = finite(s.step_time_ms), finite(s.data_wait_ms)
        compute = step - wait if step is not None and wait is not None else None
        rows.append(RankRow(rank=s.rank, host=s.host, step_ms=step, dataloader_ms=wait, compute_ms=compute))
    return rows


def waits(rows: Sequence[RankRow]) -> dict[int, float]:
    """Each rank's time waiting for the others (see the module doc), 0.0 where nothing tells.

    Estimated from host compute (no trace), a wait is at most how much later another rank's input came: the
    all-reduce inside backward evens out input, not compute, so a rank that only computes more (or ranks that
    do not sync gradients) keeps its step as its busy time."""
    computes = [r.compute_ms for r in rows if r.compute_ms is not None]
    least = min(computes) if len(computes) == len(rows) else None
    out = {}
    for r in rows:
        if r.exposed_comm_ms is not None:
            out[r.rank] = max(r.exposed_comm_ms, 0.0)
        elif least is not None and r.compute_ms is not None and r.dataloader_ms is not None:
            latest = max(o.dataloader_ms or 0.0 for o in rows if o is not r)
            out[r.rank] = max(0.0, min(r.compute_ms - least, latest - r.dataloader_ms))
        else:
            out[r.rank] = 0.0
    return out


def _waits_for(known: Sequence[RankRow], wait: dict[int, float], slow: int) -> dict[int, float]:
    """The ranks that wait for ``slow``: their wait above its own, at least STRAGGLER_MIN_GAP_MS and
    COLLECTIVE_WAIT_MIN_PCT of their step."""
    out = {}
    for r in known:
        extra = wait[r.rank] - wait[slow]
        if r.rank == slow or extra < STRAGGLER_MIN_GAP_MS:
            continue
        if 100.0 * extra / step_ms(r) >= COLLECTIVE_WAIT_MIN_PCT:
            out[r.rank] = extra
    return out


def _last_to_arrive(
    known: Sequence[RankRow], wait: dict[int, float], busy: dict[int, float]
) -> tuple[RankRow, dict[int, float]] | None:
    """The rank the others wait for in the collectives, with the ranks that wait: the least exposed
    communication (then the most busy time, then the lowest rank); None unless every rank measured its exposed
    communication and some rank waits for it."""
    if any(finite(r.exposed_comm_ms) is None for r in known):
        return None
    last = min(known, key=lambda r: (wait[r.rank], -busy[r.rank], r.rank))
    waiting = _waits_for(known, wait, last.rank)
    return (last, waiting) if waiting else None


def find_straggler(rows: Sequence[RankRow]) -> Straggler | None:
    """The rank the others wait for in collectives (see the module doc), else the rank busy longest when it is
    busy STRAGGLER_RATIO times the median of the others and at least STRAGGLER_MIN_GAP_MS longer; None with
    fewer than two ranks with a step time."""
    known = [r for r in rows if finite(r.step_ms) is not None]
    if len(known) < 2:
        return None
    wait = waits(known)
    busy = {r.rank: step_ms(r) - wait[r.rank] for r in known}
    arrived = _last_to_arrive(known, wait, busy)
    if arrived is not None:
        slow, waiting = arrived
        waited: float | None = statistics.median(waiting.values())
    else:
        slow, waiting, waited = max(known, key=lambda r: (busy[r.rank], -r.rank)), {}, None
    median = statistics.median(busy[r.rank] for r in known if r is not slow)
    lead = busy[slow.rank] - median
    if waited is None and (lead < STRAGGLER_MIN_GAP_MS or busy[slow.rank] <= STRAGGLER_RATIO * median):
        return None
    # the part of its step that explains the lead (or, found from the collectives, the others' wait)
    explain = waited if waited is not None else lead
    part, part_ms, part_median, best = None, None, None, 0.0
    for key in PARTS:
        mine = finite(getattr(slow, key))
        theirs = [v for r in known if r is not slow and (v := finite(getattr(r, key))) is not None]
        if mine is None or not theirs:
            continue
        excess = mine - statistics.median(theirs)
        if excess > best and excess >= max(STRAGGLER_MIN_GAP_MS, STRAGGLER_PART_MIN_SHARE * explain):
            part, part_ms, part_median, best = key, mine, statistics.median(theirs), excess
    return Straggler(
        slow.rank, busy[slow.rank], median, lead, part, part_ms, part_median, waited, tuple(sorted(waiting))
    )


def _name(row: RankRow, capital: bool = False) -> str:
    return ("Rank" if capital else "rank") + f" {row.rank}" + (f" ({row.host})" if row.host else "")


def _busy_words(row: RankRow) -> str:
    if row.exposed_comm_ms is not None:
        return " not counting its exposed communication"
    if row.compute_ms is not None:
        return " not counting its estimated wait in the gradient all-reduce"
    return ""


def _arrives_last(slow: RankRow, found: Straggler, rows: Sequence[RankRow]) -> str:
    """What the collectives say of the straggler: it has the least exposed communication, the others wait."""
    theirs = [v for r in rows if r is not slow and (v := finite(r.exposed_comm_ms)) is not None]
    return (
        f" It arrives last at the collectives: its exposed communication is {_fmt(slow.exposed_comm_ms)} ms a "
        f"step, the least of {len(theirs) + 1} ranks (median of the others {_fmt(statistics.median(theirs))} "
        f"ms), and {len(found.waiting)} of {others(len(theirs))} wait {_fmt(found.waited_ms)} ms a step for "
        "it (median)."
    )


def _instead(slow: RankRow, found: Straggler, meanwhile: bool = False) -> str:
    """What the straggler does while the others wait: the part of its step that differs most."""
    if found.part is None or found.part_ms is None or found.part_median_ms is None:  # set together
        return (
            f" No one part of rank {slow.rank}'s step (DataLoader, GPU kernels, GPU idle, host-blocking calls) "
            "stands out against the others'."
        )
    label, mine, theirs = PARTS[found.part][0], _fmt(found.part_ms), _fmt(found.part_median_ms)
    more = _fmt(found.part_ms - found.part_median_ms)
    if meanwhile:
        return (
            f" Meanwhile rank {slow.rank} spends {mine} ms a step in its {label}, against {theirs} ms median "
            f"of the others (+{more} ms)."
        )
    return (
        f" Its {label} differs most: {mine} ms a step against {theirs} ms median of the others (+{more} ms)."
    )


def straggler(rows: Sequence[RankRow]) -> Finding | None:
    """The rank whose step (less its own waiting) is longest, or that the others wait for in the collectives,
    by how much against the median rank, with the spread of step times across ranks and the part of its step
    that differs, with the fix for that part."""
    found = find_straggler(rows)
    if found is None:
        return None
    by_rank = {r.rank: r for r in rows}
    slow = by_rank[found.rank]
    steps = [step for r in rows if (step := finite(r.step_ms)) is not None]
    n_others = len(steps) - 1
    ratio = f"{found.busy_ms / found.median_busy_ms:.2f}x" if found.median_busy_ms > 0 else "above zero"
    sign = "+" if found.lead_ms >= 0 else "-"
    evidence = (
        f"{_name(slow, capital=True)} takes {_fmt(found.busy_ms)} ms a step{_busy_words(slow)}, against "
        f"{_fmt(found.median_busy_ms)} ms for the median of {others(n_others)} ({sign}"
        f"{_fmt(abs(found.lead_ms))} ms, {ratio}); step times across ranks {_fmt(min(steps))}-"
        f"{_fmt(max(steps))} ms (spread {_fmt(max(steps) - min(steps))} ms)."
    )
    if found.waited_ms is not None:
        evidence += _arrives_last(slow, found, rows)
    else:
        evidence += " Every rank waits for the slowest at each collective."
    title = f"Straggler: {_name(slow)}"
    if found.part is not None:
        label, recommendation = PARTS[found.part]
        title += f", in its {label}"
        evidence += _instead(slow, found)
    else:
        recommendation = (
            "Check that rank's host for CPU contention, slower storage or fewer cores per DataLoader, and for "
            "a throttled or shared GPU."
        )
    if found.waited_ms is not None:  # the share of their step the waiting ranks lose
        median_step = statistics.median(step_ms(by_rank[r]) for r in found.waiting)
        high = median_step > 0 and 100.0 * found.waited_ms / median_step >= STRAGGLER_HIGH_PCT
    else:  # the others' step stretches to the straggler's
        high = step_ms(slow) > 0 and 100.0 * found.lead_ms / step_ms(slow) >= STRAGGLER_HIGH_PCT
    return Finding(
        id="straggler",
        severity="high" if high else "medium",
        title=title,
        evidence=evidence,
        recommendation=recommendation,
    )


def waiting_ranks(rows: Sequence[RankRow]) -> dict[int, float]:
    """The ranks that wait for the straggler in collectives, each with its wait in ms a step (its own wait
    above the straggler's, at least STRAGGLER_MIN_GAP_MS and COLLECTIVE_WAIT_MIN_PCT of its step)."""
    found = find_straggler(rows)
    if found is None:
        return {}
    known = [r for r in rows if finite(r.step_ms) is not None]
    return _waits_for(known, waits(known), found.rank)


def late_ranks(rows: Sequence[RankRow]) -> list[int]:
    """The ranks the others wait for: the straggler and the ranks whose wait is within STRAGGLER_MIN_GAP_MS of
    its own (they arrive as late); empty unless some rank waits for the straggler."""
    found = find_straggler(rows)
    known = [r for r in rows if finite(r.step_ms) is not None]
    wait = waits(known)
    if found is None or not _waits_for(known, wait, found.rank):
        return []
    return [r.rank for r in known if wait[r.rank] - wait[found.rank] < STRAGGLER_MIN_GAP_MS]


def collective_wait(rows: Sequence[RankRow]) -> Finding | None:
    """Ranks whose exposed communication is long while the straggler's input or compute is: they wait in the
    collective for it, which is not a communication problem of their own. Says what the straggler does
    meanwhile, and names the ranks that arrive as late as it."""
    waiting = waiting_ranks(rows)
    found = find_straggler(rows)
    if not waiting or found is None:
        return None
    by_rank = {r.rank: r for r in rows}
    slow = by_rank[found.rank]
    late = late_ranks(rows)
    waited_for = f"rank {slow.rank}" if len(late) == 1 else f"ranks {rank_list(late)}"
    median_wait = statistics.median(waiting.values())
    median_step = statistics.median(step_ms(by_rank[r]) for r in waiting)
    names = rank_list(waiting)
    plural, verb, their = ("ranks", "wait", "their") if len(waiting) > 1 else ("rank", "waits", "its")
    measured = all(by_rank[r].exposed_comm_ms is not None for r in waiting)
    backend = slow.backend or next((by_rank[r].backend for r in waiting if by_rank[r].backend), None)
    where = f"in {backend.upper()}" if measured and backend else "in collectives"
    spread = (
        f" ({_fmt(min(waiting.values()))}-{_fmt(max(waiting.values()))} ms across them)"
        if max(waiting.values()) - min(waiting.values()) >= 0.05  # differs once rounded to 0.1
        else ""
    )
    if measured:
        how = (
            f"{their} exposed communication is {_fmt(median_known(by_rank[r].exposed_comm_ms for r in waiting))} "
            f"ms a step (median) against {_fmt(slow.exposed_comm_ms)} ms on rank {slow.rank}"
        )
    else:
        how = (
            f"estimated from {their} host compute, which holds the gradient all-reduce: "
            f"{_fmt(median_known(by_rank[r].compute_ms for r in waiting))} ms a step (median) against "
            f"{_fmt(slow.compute_ms)} ms on rank {slow.rank}"
        )
    with_it = [r for r in late if r != slow.rank]
    subject = (
        f"Ranks {rank_list(with_it)} arrive" if len(with_it) > 1 else f"Rank {rank_list(with_it)} arrives"
    )
    also = f" {subject} within {_fmt(STRAGGLER_MIN_GAP_MS)} ms of rank {slow.rank}." if with_it else ""
    meanwhile = _instead(slow, found, meanwhile=True)
    high = median_step > 0 and 100.0 * median_wait / median_step >= COLLECTIVE_WAIT_HIGH_PCT
    return Finding(
        id="collective_wait",
        severity="high" if high else "medium",
        title=f"{plural.capitalize()} {names} {verb} for {waited_for} in collectives",
        evidence=f"{plural.capitalize()} {names} {verb} {_fmt(median_wait)} ms a step {where} for rank "
        f"{slow.rank}{spread}: {how}. This is waiting for the straggler, not slow communication.{also}"
        f"{meanwhile}",
        recommendation=f"Make rank {slow.rank} faster (see the straggler finding); tuning the communication "
        "of the waiting ranks (DDP buckets, overlap) would not shorten the wait.",
    )


def diagnose_ranks(rows: Sequence[RankRow]) -> list[Finding]:
    """The cross-rank findings, most severe first."""
    findings = [f for rule in (straggler, collective_wait) if (f := rule(rows)) is not None]
    return sorted(findings, key=lambda f: SEVERITY_ORDER.index(f.severity))


def without_own_communication(
    findings: Sequence[Finding], row: RankRow, wait_ms: float, straggler_rank: int
) -> list[Finding]:
    """A waiting rank's findings without ``exposed_communication`` for the time it waited for the straggler:
    dropped when what remains is under the finding's line, else kept with the wait named in its evidence."""
    out = []
    for f in findings:
        if f.id != "exposed_communication":
            out.append(f)
            continue
        own = (row.exposed_comm_ms or 0.0) - wait_ms
        if row.step_ms and 100.0 * own / row.step_ms >= EXPOSED_COMM_MEDIUM_PCT:
            out.append(
                dataclasses.replace(
                    f,
                    evidence=f.evidence + f" {_fmt(wait_ms)} ms of it is waiting for rank {straggler_rank} "
                    "(see collective_wait).",
                )
            )
    return out
