"""The cross-rank verdict from what the traces show, on synthetic rank sets built to mirror real shapes.

The 8-rank set mirrors a DLRM run (issue 34, point 6): every rank is held in lockstep by an NCCL all-reduce a step;
rank 7's host spends 12 ms a step on host-side work before it launches its compute, so its GPU idles while ranks
0-6 wait in the all-reduce for it (9-12 ms a step of exposed communication against its 2 ms). The lead of rank 7
in busy time (1.16x the median) is under the straggler's 1.2x line: only the collectives tell who is waited for.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from lightning_perf.traces.report.build import build_report
from lightning_perf.traces.report.ranks import SPREAD_FIGURES, detailed_ranks
from lightning_perf.traces.report.render import render_markdown, render_text

WORLD, LATE, STEPS = 8, 7, 4
STEP_US = 80_000.0
HOST_WORK_US = 12_000.0  # rank 7's extra host-side work a step, before it launches its compute
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
DATALOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


class Events:
    """A trace's events with torch's shapes: host spans on pid 1, kernels on pid 0, launches correlated."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.correlation = 0

    def span(
        self, name: str, cat: str, ts: float, dur: float, pid: int = 1, tid: int = 1, **args: Any
    ) -> None:
        self.events.append(
            {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}
        )

    def launch(self, op: str, kernel: str, at: float, start: float, dur: float, stream: int = 7) -> None:
        """Operator ``op`` at ``at`` launches ``kernel``, which runs [start, start + dur] on ``stream``."""
        self.correlation += 1
        self.span(op, "cpu_op", at, 20.0, **{"External id": self.correlation})
        self.span("cudaLaunchKernel", "cuda_runtime", at + 5.0, 10.0, correlation=self.correlation)
        self.span(
            kernel, "kernel", start, dur, pid=0, tid=stream, correlation=self.correlation, stream=stream
        )


def write_trace(path: Path, events: Events, rank: int, world: int = WORLD) -> Path:
    header = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100", "computeMajor": 9, "computeMinor": 0}],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
    }
    path.write_text(json.dumps({**header, "traceEvents": events.events}))
    return path


def lockstep_rank(rank: int, training: bool = True) -> Events:
    """One rank of the 8: per step, compute kernels then the all-reduce, which ends when rank 7 arrives."""
    ev = Events()
    for step in range(STEPS):
        s = step * STEP_US
        ev.span(f"ProfilerStep#{step}", "user_annotation", s, STEP_US)
        compute = 45_000.0 + (0.0 if rank == LATE else 500.0 * rank)
        start = s + 1_000.0
        if rank == LATE:  # host-side work with nothing on the GPU, then the same compute as the others
            ev.span("aten::index", "cpu_op", s + 100.0, HOST_WORK_US - 200.0)
            start += HOST_WORK_US
        ev.launch("aten::mm", "sm90_xmma_gemm_bf16bf16_bf16f32", start - 500.0, start, compute)
        if training:
            ev.span("autograd::engine::evaluate_function: MmBackward0", "cpu_op", start - 400.0, 100.0)
        # rank 7 arrives last: every all-reduce ends 2 ms after its compute
        arrive = s + 1_000.0 + HOST_WORK_US + 45_000.0
        ev.launch(
            "nccl:all_reduce",
            NCCL,
            start + compute - 800.0,
            start + compute,
            arrive + 2_000.0 - start - compute,
            stream=20,
        )
        if training:
            ev.span("Optimizer.step#SGD.step", "cpu_op", arrive + 2_500.0, 300.0)
    return ev


@pytest.fixture(scope="module")
def lockstep(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("dlrm8")
    for rank in range(WORLD):
        write_trace(folder / f"node0_rank{rank}.1700000000000000000.pt.trace.json", lockstep_rank(rank), rank)
    return build_report(str(folder), top=3, jobs=1)


def table(text: str) -> tuple[list[str], dict[str, dict[str, float]]]:
    """The cross-rank table of a text report: its column labels and, by rank, each column's value."""
    lines = text[text.index("Across ranks:") :].splitlines()[1:]
    header = re.split(r"\s{2,}", lines[0].strip())
    rows = {}
    for line in lines[1:]:
        cells = re.split(r"\s{2,}", line.strip())
        if not cells[0].isdigit():
            break
        rows[cells[0]] = {
            h: float(c) if c != "-" else None for h, c in zip(header[1:], cells[1:], strict=True)
        }
    return header, rows


def test_the_rank_that_arrives_last_is_the_one_the_others_wait_for(lockstep):
    ranks = lockstep["ranks"]
    assert ranks["straggler"] == LATE and ranks["waited_for"] == [LATE]
    assert ranks["waiting"] == list(range(LATE))
    by_id = {f["id"]: f for f in ranks["findings"]}
    wait = by_id["collective_wait"]
    assert wait["title"] == "Ranks 0-6 wait for rank 7 in collectives"
    waited = float(re.search(r"wait ([\d.]+) ms a step in NCCL for rank 7", wait["evidence"]).group(1))
    assert waited == pytest.approx(10.5, abs=0.3)  # the median of 12, 11.5, ... 9 ms the builder put in
    assert "(9.0-12.0 ms across them)" in wait["evidence"]
    # what rank 7 does instead: its GPU idles while its host works
    assert (
        "Meanwhile rank 7 spends" in wait["evidence"] and "GPU idle time (host-side work)" in wait["evidence"]
    )
    straggler = by_id["straggler"]
    assert straggler["title"] == "Straggler: rank 7, in its GPU idle time (host-side work)"
    assert (
        "It arrives last at the collectives: its exposed communication is 2.0 ms a step"
        in (straggler["evidence"])
    )
    # the waiting ranks' exposed communication is the wait, not a problem of their own
    assert all(
        f["id"] != "exposed_communication"
        for t in lockstep["traces"]
        if t["rank"] != LATE
        for f in t["findings"]
    )


def test_every_label_is_read_from_a_column_of_the_table(lockstep):
    ranks = lockstep["ranks"]
    text = render_text(lockstep, detailed_ranks(lockstep))
    header, rows = table(text)
    assert header == ["Rank", *SPREAD_FIGURES.values()]
    standout, by = ranks["standout"], ranks["standout_by"]
    assert set(by) == set(standout) and set(by.values()) <= set(header)
    line = next(line for line in text.splitlines() if line.startswith("Details of the ranks that stand out"))
    for role, rank in standout.items():
        label = role.replace("_", " ")
        assert f"rank {rank} ({label})" in line
        assert by[role] in line  # the column each label is read from is named where the label is
    busy = {int(r): row["non-comm ms"] for r, row in rows.items()}
    wait = {int(r): row["wait ms"] for r, row in rows.items()}
    assert standout["slowest"] == max(busy, key=busy.get) == LATE
    assert standout["waits_most"] == max(wait, key=wait.get) == 0 and wait[LATE] == 0.0
    assert busy[LATE] - busy[0] == pytest.approx(wait[0], abs=0.15)  # lockstep: equal steps
    assert rows[str(LATE)]["exposed comm ms"] == min(row["exposed comm ms"] for row in rows.values())
    assert standout["median"] in busy
    markdown = render_markdown(lockstep, detailed_ranks(lockstep))
    assert "| Rank | step ms | non-comm ms | exposed comm ms | wait ms |" in markdown


def inference_trace(path: Path, training: bool) -> Path:
    """One GPU rank, half of each step in the DataLoader; a forward pass only unless ``training``."""
    ev = Events()
    for step in range(3):
        s = step * 10_000.0
        ev.span(f"ProfilerStep#{step}", "user_annotation", s, 10_000.0)
        ev.span(DATALOADER, "user_annotation", s + 100.0, 5_000.0)
        ev.launch("aten::linear", "sm90_xmma_gemm_bf16bf16_bf16f32", s + 5_200.0, s + 5_300.0, 4_000.0)
        if training:
            ev.launch(
                "autograd::engine::evaluate_function: AddmmBackward0",
                "gemm_backward",
                s + 9_400.0,
                s + 9_400.0,
                300.0,
            )
            ev.span("Optimizer.step#AdamW.step", "cpu_op", s + 9_800.0, 100.0)
    return write_trace(path, ev, rank=0, world=1)


@pytest.mark.parametrize("training", [False, True])
def test_a_trace_without_backward_is_not_called_training(tmp_path, training):
    report = build_report(str(inference_trace(tmp_path / "serve.pt.trace.json", training)), jobs=1)
    (trace,) = report["traces"]
    bound = next(f for f in trace["findings"] if f["id"] == "input_bound")
    assert trace["figures"]["training"] is training
    text = render_text(report)
    if training:
        assert bound["title"] == "Training is highly input-bound"
        assert "training DataLoader" in bound["recommendation"] and "forward-only" not in text
    else:
        assert bound["title"] == "The run is highly input-bound"
        assert "no backward pass and no optimizer step" in bound["evidence"]
        assert "training" not in bound["title"].lower() + bound["recommendation"]
        assert "Training is" not in text and "a forward-only run" in text


def test_ranks_that_arrive_together_last_are_named_together():
    from lightning_perf.analysis.rules.cross_rank import RankRow, collective_wait, find_straggler

    # ranks 6 and 7 arrive within 0.5 ms of each other, 12 ms after the others: busy 1.18x, under the 1.2x line
    exposed = [14.0] * 6 + [2.5, 2.0]
    rows = [RankRow(rank=r, step_ms=80.0, exposed_comm_ms=e, backend="nccl") for r, e in enumerate(exposed)]
    assert find_straggler(rows).rank == 7
    finding = collective_wait(rows)
    assert finding.title == "Ranks 0-5 wait for ranks 6-7 in collectives"
    assert "Ranks 0-5 wait 12.0 ms a step in NCCL for rank 7" in finding.evidence
    assert "Rank 6 arrives within 2.0 ms of rank 7." in finding.evidence


def overlapping_rank(rank: int) -> Events:
    """Mirrors DLRM rank 1 (issue 34, point 5): each step opens with a 1.1 ms DataLoader call; on rank 1 the previous
    step's last kernel still runs then (it ends 2 ms into the next step), on rank 0 it has ended."""
    ev = Events()
    for step in range(STEPS):
        s = step * 20_000.0
        ev.span(f"ProfilerStep#{step}", "user_annotation", s, 20_000.0)
        ev.span(DATALOADER, "user_annotation", s + 100.0, 1_100.0)
        tail = 2_000.0 if rank == 1 else -2_000.0  # how far the last kernel runs past the step's end
        ev.launch("aten::mm", "sm90_xmma_gemm_bf16bf16_bf16f32", s + 1_300.0, s + 1_400.0, 18_600.0 + tail)
    return ev


def test_a_dataloader_call_under_the_previous_steps_kernels_is_no_cross_rank_spread(tmp_path):
    for rank in (0, 1):
        write_trace(
            tmp_path / f"node0_rank{rank}.1700000000000000000.pt.trace.json", overlapping_rank(rank), rank, 2
        )
    report = build_report(str(tmp_path), jobs=1)
    figures = {t["rank"]: t["figures"] for t in report["traces"]}
    # the step alignment hides rank 1's call under the previous step's kernel: the share counts exposed time only
    assert figures[1]["dataloader_pct"] < 0.5 * figures[0]["dataloader_pct"]  # step 0 has no kernel before it
    for rank in (0, 1):  # the call itself is the same on both ranks
        assert figures[rank]["dataloader_call_ms"] == pytest.approx(1.1, abs=0.01)
    header, rows = table(render_text(report))
    assert "DataLoader ms" in header and "DataLoader %" not in header
    assert report["ranks"]["spread"]["dataloader_call_ms"] == pytest.approx(0.0, abs=0.01)
    assert not [f for f in report["ranks"]["findings"] if "DataLoader" in f["title"]]


def test_report_alignment_launch_keeps_the_dataloader_call_in_its_step(tmp_path, capsys):
    from lightning_perf import cli

    path = write_trace(tmp_path / "node0_rank1.1700000000000000000.pt.trace.json", overlapping_rank(1), 1, 1)
    shares = {}
    for alignment in ("torch-tb-profiler", "launch"):
        assert cli.main(["report", str(path), "--format", "json", "--alignment", alignment]) == 0
        (trace,) = json.loads(capsys.readouterr().out)["traces"]
        assert trace["alignment"] == alignment and trace["overlapping_steps"] is (alignment == "launch")
        shares[alignment] = trace["average"]["categories_ms"]["dataloader"]
    # the time cut hides the calls of steps 1-3 under the previous kernels; launch keeps each in its step
    assert shares["torch-tb-profiler"] < 0.5 and shares["launch"] == pytest.approx(1.1, abs=0.01)
    with pytest.raises(SystemExit) as refused:  # argparse's own refusal, naming the choices
        cli.main(["report", str(path), "--alignment", "sideways"])
    assert refused.value.code == 2 and "choose from 'torch-tb-profiler', 'launch'" in capsys.readouterr().err
