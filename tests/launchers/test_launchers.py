"""Real launchers on CPU (gloo): Lightning's ``strategy="ddp"`` subprocess launcher, a two-node ``torchrun`` job on
the loopback address, FSDP's refusal on CPU, and faults at this scale (a rank SIGKILLed, SIGTERM to every rank
then a resumed run). Each job runs ``tests/launchers/fit_script.py`` in subprocesses; every test kills what it
started, whatever happens."""

from __future__ import annotations

import os
import re
import socket

import lightning as L
import pytest
import torch

from lightning_perf.analysis.summary import RunSummary
from lightning_perf.collect.profiling.schedule import ProfileSchedule
from tests.helpers import load_trace, step_spans, trace_files
from tests.launchers.procs import ddp_job, torchrun_job

# the fit script's schedule: a cycle of 4 batches from batch 2, recording 2 of them, cycle after cycle
SCHEDULE = ProfileSchedule(skip_first=2, wait=1, warmup=1, active=2, repeat=0)
JOB_TIMEOUT_S = (
    240  # a deadline far above a normal run (10-20 s idle), so a hang fails instead of blocking CI
)


def log_dir(root, version: int = 0) -> str:
    return os.path.join(str(root), "lightning_logs", f"version_{version}")


def traced_rank(path: str) -> int:
    return int(re.search(r"_rank(\d+)\.", os.path.basename(path)).group(1))


def rank_summaries(root) -> dict[int, RunSummary]:
    """What each rank measured, as each rank wrote it (the fit script saves ``callback.last_summary``)."""
    folder = os.path.join(str(root), "summaries")
    found = {}
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        found[int(re.search(r"rank(\d+)", name).group(1))] = RunSummary.load(os.path.join(folder, name))
    return found


def run(job, timeout_s: float = JOB_TIMEOUT_S) -> list[int]:
    try:
        return job.wait(timeout_s)
    finally:
        job.kill()


@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
def test_ddp_subprocess_launcher_gives_every_rank_its_traces_and_the_rank_table(tmp_path):
    codes = run(ddp_job(tmp_path, "--samples", "48"))
    assert codes == [0], f"exit codes {codes}"
    files = trace_files(log_dir(tmp_path))
    assert sorted({traced_rank(f) for f in files}) == [0, 1]  # "auto" traces both ranks of a small job
    for path in files:
        trace = load_trace(path)  # whole: gzip and JSON readable
        assert trace["distributedInfo"]["world_size"] == 2 and trace["distributedInfo"]["backend"] == "gloo"
        assert f"_rank{trace['distributedInfo']['rank']}." in os.path.basename(path)
    summary = RunSummary.load(log_dir(tmp_path))
    assert summary.status == "finished" and summary.world_size == 2 and summary.trace_ranks == [0, 1]
    assert [r.rank for r in summary.ranks] == [0, 1]
    assert all(r.step_time_ms and r.host == socket.gethostname() for r in summary.ranks)
    per_rank = rank_summaries(tmp_path)
    assert sorted(per_rank) == [0, 1] and all(s.status == "finished" for s in per_rank.values())
    assert [t.path for t in per_rank[1].traces] and all(traced_rank(t.path) == 1 for t in per_rank[1].traces)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """2 nodes x 1 process via torchrun; node 1's DataLoader sleeps 3 ms a sample; only rank 1 traces."""
    root = tmp_path_factory.mktemp("torchrun")
    job = torchrun_job(
        root, "--samples", "48", "--trace-ranks", "[1]", "--slow-rank", "1", "--delay-s", "0.003"
    )
    codes = run(job)
    assert codes == [0, 0], f"exit codes {codes}\n{job.tail()}"
    return root


@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
def test_torchrun_two_nodes_trace_only_the_listed_rank(two_nodes):
    files = trace_files(log_dir(two_nodes))
    assert files and {traced_rank(f) for f in files} == {1}
    for path in files:
        assert load_trace(path)["distributedInfo"]["rank"] == 1
    summary = RunSummary.load(log_dir(two_nodes))
    assert summary.trace_ranks == [1] and summary.traces == []  # rank 0 wrote the summary, and no trace
    per_rank = rank_summaries(two_nodes)
    assert per_rank[0].timing.steps == per_rank[1].timing.steps > 0  # rank 0 timed every step all the same
    assert len(per_rank[1].traces) == len(files)


@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
def test_torchrun_rank_table_has_node_rank_and_host_and_the_slow_node(two_nodes):
    summary = RunSummary.load(log_dir(two_nodes))
    assert summary.world_size == 2
    assert [(r.rank, r.node_rank, r.host) for r in summary.ranks] == [
        (0, 0, socket.gethostname()),
        (1, 1, socket.gethostname()),
    ]
    slow, fast = summary.ranks[1], summary.ranks[0]
    assert slow.data_wait_ms > fast.data_wait_ms + 4.0  # 12 ms of sleep a batch on node 1
    (straggler,) = [f for f in summary.findings if f.id == "straggler"]
    assert "rank 1" in straggler.title + straggler.evidence


def test_fsdp_is_refused_on_cpu_by_lightning():
    # Lightning 2.6's FSDPStrategy needs CUDA: lightning-perf cannot be run under it on a CPU-only machine
    with pytest.raises(ValueError, match="strategy `fsdp` requires a GPU accelerator"):
        L.Trainer(accelerator="cpu", devices=2, strategy="fsdp", logger=False)


@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
def test_a_rank_killed_mid_run_leaves_the_survivor_failed_not_hanging(tmp_path):
    job = torchrun_job(
        tmp_path, "--max-steps", "400", "--step-sleep-s", "0.01", "--kill-rank", "1", "--kill-at", "6"
    )
    codes = run(job)  # the deadline is the hang check: the survivor must end on its own
    assert codes[0] != 0 and codes[1] != 0
    per_rank = rank_summaries(tmp_path)
    assert sorted(per_rank) == [0], "rank 1 was SIGKILLed: it writes nothing"
    assert per_rank[0].status == "failed" and per_rank[0].timing.steps >= 5
    assert RunSummary.load(log_dir(tmp_path)).status == "failed"
    for path in trace_files(log_dir(tmp_path)):
        load_trace(path)  # whatever was written is whole


@pytest.mark.timeout(2 * JOB_TIMEOUT_S + 60)
def test_sigterm_to_every_rank_then_a_resumed_run_continues_the_schedule(tmp_path):
    first = tmp_path / "first"
    # every rank gets SIGTERM at global step 10 (see fit_script.ScriptedModel for why from inside the step)
    job = torchrun_job(first, "--max-steps", "16", "--sigterm-at", "10", "--ckpt-every", "4")
    run(job)  # Lightning's SIGTERMException is a SystemExit: the exit codes say nothing, the summaries do
    per_rank = rank_summaries(first)
    assert sorted(per_rank) == [0, 1] and all(s.status == "interrupted" for s in per_rank.values())
    assert RunSummary.load(log_dir(first)).status == "interrupted"
    files = trace_files(log_dir(first))
    assert {traced_rank(f) for f in files} == {0, 1}
    for path in files:
        assert step_spans(load_trace(path))  # whole: gzip and JSON readable, with its steps

    checkpoint = str(first / "ckpt" / "last.ckpt")
    resumed_at = torch.load(checkpoint, map_location="cpu", weights_only=False)["global_step"]
    assert resumed_at == 8  # saved every 4 steps; the run stopped at step 10
    second = tmp_path / "second"
    codes = run(ddp_job(second, "--resume", checkpoint, "--max-steps", str(resumed_at + 8)))
    assert codes == [0]
    summary = RunSummary.load(log_dir(second))
    # 8 batches ran, the fit's first is no timed step: Lightning < 2.5 restarts the (non-resumable) loader as a new
    # epoch, whose first batch is an epoch start; from 2.5 the loader resumes mid-epoch and its first batch is the
    # one whose FLOPs are counted, left out of the figures like any batch the FLOP counter slowed (issue 54)
    assert summary.status == "finished" and summary.timing.steps == 7
    expected = [s for s in range(resumed_at, resumed_at + 8) if SCHEDULE.action(s).name.startswith("RECORD")]
    for rank, ran in rank_summaries(second).items():
        assert [s for t in ran.traces for s in t.steps] == expected, f"rank {rank}"
        for trace in ran.traces:
            spans = step_spans(load_trace(os.path.join(log_dir(second), trace.path)))
            assert [s["name"] for s in spans] == [f"ProfilerStep#{s}" for s in trace.steps]
