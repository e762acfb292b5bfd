"""The cross-rank rules (straggler, collective_wait) over plain per-rank rows: pure, no trace, no Trainer."""

import pytest

from lightning_perf.analysis.rules.cross_rank import (
    PARTS,
    RankRow,
    collective_wait,
    diagnose_ranks,
    rank_list,
    rows_from_stats,
    straggler,
    waiting_ranks,
    without_own_communication,
)
from lightning_perf.analysis.rules.thresholds import STRAGGLER_MIN_GAP_MS, STRAGGLER_RATIO
from lightning_perf.analysis.rules.trace_thresholds import EXPOSED_COMM_MEDIUM_PCT
from lightning_perf.analysis.summary import Finding, RankStats


def lockstep(world=16, slow=9, delay=40.0, part="dataloader_ms"):
    """Ranks held in lockstep by a collective: the slow rank's ``part`` is ``delay`` ms longer, every other
    rank waits that long in NCCL (its exposed communication), all steps equally long."""
    rows = []
    for rank in range(world):
        figures = {"dataloader_ms": 0.5, "kernel_ms": 90.0, "blocking_ms": 5.0, "idle_ms": 4.0}
        exposed = 12.0
        if rank == slow:
            figures[part] += delay
        else:
            exposed += delay
        rows.append(RankRow(rank=rank, step_ms=160.0, exposed_comm_ms=exposed, backend="nccl", **figures))
    return rows


def test_lockstep_straggler_is_named_by_its_busy_time_and_the_part_that_differs():
    finding = straggler(lockstep())
    assert finding.id == "straggler" and finding.severity == "high"  # 40 of 160 ms lost by every other rank
    assert finding.title == "Straggler: rank 9, in its DataLoader wait"
    assert (
        "Rank 9 takes 148.0 ms a step not counting its exposed communication, against 108.0 ms for the "
        in (finding.evidence)
    )
    assert "median of the other 15 ranks (+40.0 ms, 1.37x)" in finding.evidence
    assert "step times across ranks 160.0-160.0 ms (spread 0.0 ms)" in finding.evidence
    assert (
        "DataLoader wait differs most: 40.5 ms a step against 0.5 ms median of the others" in finding.evidence
    )
    assert finding.recommendation == PARTS["dataloader_ms"][1]


def test_the_ranks_that_wait_are_named_as_ranges_with_their_wait():
    finding = collective_wait(lockstep())
    assert finding.title == "Ranks 0-8, 10-15 wait for rank 9 in collectives"
    assert "Ranks 0-8, 10-15 wait 40.0 ms a step in NCCL for rank 9" in finding.evidence
    assert "exposed communication is 52.0 ms a step (median) against 12.0 ms on rank 9" in finding.evidence
    assert finding.severity == "high"  # 40 of 160 ms: 25%, the high line of exposed communication
    assert waiting_ranks(lockstep()) == {r: pytest.approx(40.0) for r in range(16) if r != 9}
    assert [f.id for f in diagnose_ranks(lockstep())] == ["straggler", "collective_wait"]


@pytest.mark.parametrize("part", ["kernel_ms", "blocking_ms", "idle_ms"])
def test_each_part_gets_its_own_fix(part):
    finding = straggler(lockstep(world=4, slow=2, delay=30.0, part=part))
    label, fix = PARTS[part]
    assert finding.title == f"Straggler: rank 2, in its {label}"
    assert finding.recommendation == fix


def test_a_rank_whose_step_is_longer_without_lockstep():
    # no collective holds them together: rank 3's kernels run longer and so does its step
    rows = [RankRow(rank=r, host="node0", step_ms=100.0, kernel_ms=60.0) for r in range(3)]
    rows.append(RankRow(rank=3, host="node1", step_ms=135.0, kernel_ms=95.0))
    finding = straggler(rows)
    assert finding.title == "Straggler: rank 3 (node1), in its GPU kernels"
    assert "Rank 3 (node1) takes 135.0 ms a step, against 100.0 ms for the median of the other 3 ranks" in (
        finding.evidence
    )
    assert "(+35.0 ms, 1.35x); step times across ranks 100.0-135.0 ms (spread 35.0 ms)" in finding.evidence
    assert "nvidia-smi" in finding.recommendation
    assert collective_wait(rows) is None  # nothing says the others waited


def test_the_straggler_lines():
    def rows(slow_ms):
        return [RankRow(rank=r, step_ms=10.0) for r in range(3)] + [RankRow(rank=3, step_ms=slow_ms)]

    above = 10.0 * STRAGGLER_RATIO + 0.1
    assert straggler(rows(above)).severity == "medium"  # 2.1 of 12.1 ms: under the 20% high line
    assert straggler(rows(10.0 * STRAGGLER_RATIO)) is None
    tiny = [RankRow(rank=r, step_ms=1.0) for r in range(3)] + [
        RankRow(rank=3, step_ms=1.0 + STRAGGLER_MIN_GAP_MS / 2)
    ]
    assert straggler(tiny) is None  # 1.5x, but under the gap: sub-ms jitter


def test_silent_without_two_ranks_with_a_step_time():
    assert straggler([RankRow(rank=0, step_ms=10.0)]) is None
    assert straggler([RankRow(rank=0, step_ms=10.0), RankRow(rank=1)]) is None
    assert diagnose_ranks([]) == []
    even = [RankRow(rank=r, step_ms=50.0, exposed_comm_ms=5.0) for r in range(8)]
    assert diagnose_ranks(even) == []


def test_a_short_wait_is_not_a_collective_wait():
    # rank 1 is a straggler by busy time, but rank 0's extra exposed communication is under 10% of its step
    rows = [
        RankRow(rank=0, step_ms=100.0, dataloader_ms=0.0, exposed_comm_ms=9.0),
        RankRow(rank=1, step_ms=130.0, dataloader_ms=30.0, exposed_comm_ms=0.0),
    ]
    assert straggler(rows) is not None
    assert EXPOSED_COMM_MEDIUM_PCT > 100.0 * 9.0 / 100.0
    assert collective_wait(rows) is None


def test_the_callbacks_table_estimates_the_wait_from_host_compute():
    # lockstep under DDP: rank 1's loader is late, rank 0 waits for it inside backward (in its compute)
    stats = [RankStats(0, "hostA", step_time_ms=20.0, data_wait_ms=1.0), RankStats(1, "hostB", 20.0, 9.0)]
    rows = rows_from_stats(stats)
    assert [r.compute_ms for r in rows] == [19.0, 11.0]
    finding = straggler(rows)
    assert finding.title == "Straggler: rank 1 (hostB), in its DataLoader wait"
    assert "not counting its estimated wait in the gradient all-reduce" in finding.evidence
    wait = collective_wait(rows)
    assert wait.title == "Rank 0 waits for rank 1 in collectives"
    assert (
        "Rank 0 waits 8.0 ms a step in collectives for rank 1: estimated from its host compute"
        in wait.evidence
    )


def test_a_rank_that_only_computes_more_keeps_its_step_as_its_busy_time():
    # ranks that do not wait for each other's input (no gradient sync, or compute that differs): step times
    # tell, and the compute difference is the cause, not a wait
    stats = [
        RankStats(0, "hostA", 11.0, 1.0),
        RankStats(1, "hostB", 31.0, 1.0),
        RankStats(2, "hostC", 11.0, 1.0),
    ]
    finding = straggler(rows_from_stats(stats))
    assert finding.title == "Straggler: rank 1 (hostB), in its host compute"
    assert (
        "takes 31.0 ms a step not counting its estimated wait in the gradient all-reduce, against 11.0 ms"
        in (finding.evidence)
    )
    assert collective_wait(rows_from_stats(stats)) is None


def test_no_part_is_named_when_none_explains_half_the_lead():
    rows = [RankRow(rank=r, host="Node-A", step_ms=100.0, dataloader_ms=1.0) for r in range(3)]
    rows.append(RankRow(rank=3, host="Node-B", step_ms=140.0, dataloader_ms=6.0))  # 5 of its 40 ms
    finding = straggler(rows)
    assert finding.title == "Straggler: rank 3 (Node-B)"  # the host as it is spelt
    assert finding.evidence.startswith("Rank 3 (Node-B) takes 140.0 ms a step")
    assert "differs most" not in finding.evidence


def test_rank_lists():
    assert rank_list([3, 0, 1, 2, 5, 7, 8]) == "0-3, 5, 7-8"
    assert rank_list([4]) == "4"


def exposed(evidence="e"):
    return Finding("exposed_communication", "high", "t", evidence, "r")


def test_waiting_is_not_a_communication_problem_of_the_waiting_rank():
    other = Finding("host_sync", "low", "t", "e", "r")
    row = RankRow(rank=0, step_ms=160.0, exposed_comm_ms=52.0)
    # 52 - 40 = 12 ms left, 7.5% of the step: under the line, so the finding goes
    assert without_own_communication([exposed(), other], row, 40.0, 9) == [other]
    # 52 - 20 = 32 ms left, 20%: still a finding of its own, with the wait named
    (kept,) = without_own_communication([exposed()], row, 20.0, 9)
    assert kept.evidence == "e 20.0 ms of it is waiting for rank 9 (see collective_wait)."


def test_the_callbacks_trace_findings_leave_out_the_wait_of_a_waiting_rank():
    from lightning_perf.analysis.diagnosis import diagnose
    from lightning_perf.analysis.summary import RunSummary
    from lightning_perf.analysis.trace_figures import TraceFigures
    from lightning_perf.output.trace_findings import with_trace_findings

    # rank 0 waits ~40 ms a step in the all-reduce for rank 1's input; its own trace shows that wait as 32% of
    # its step in exposed communication
    def summary(rank):
        stats = [RankStats(0, "a", step_time_ms=160.0, data_wait_ms=1.0), RankStats(1, "b", 160.0, 41.0)]
        figures = TraceFigures(
            steps=4, step_ms=160.0, communication_ms_per_step=60.0, exposed_communication_ms_per_step=52.0
        )
        made = RunSummary(global_rank=rank, world_size=2, ranks=stats, trace_figures=[figures])
        made.findings = diagnose(made)
        return made

    waiting = {f.id for f in with_trace_findings(summary(0))}
    assert {"straggler", "collective_wait"} <= waiting and "exposed_communication" not in waiting
    # the straggler's own exposed communication (same figures) is its own: kept
    assert "exposed_communication" in {f.id for f in with_trace_findings(summary(1))}
