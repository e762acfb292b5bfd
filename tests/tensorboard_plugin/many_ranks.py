"""A run folder of many ranks made from one real trace (tests/data/realtraces/ddp_a100_rank0), in a tmp dir: each
rank's copy names its rank and the world size in ``distributedInfo`` (as benchmarks/bench_many_ranks.py writes
them), one rank's events stretched in time (the straggler), and a ``perf_summary.json`` whose per-rank table
and step series come from that trace's own steps (cycled to a run's length), diagnosed by the project's rules."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

from lightning_perf.analysis.diagnosis import diagnose
from lightning_perf.analysis.summary import Distribution, RankStats, RunSummary, Settings, TimingSummary
from lightning_perf.traces.report.build import analyse_trace

SOURCE = "ddp_a100_rank0/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
STEPS = 200


def _write_rank(folder: Path, rank: int, world: int, head: dict, events_text: str) -> None:
    info = {**head.get("distributedInfo", {}), "rank": rank, "world_size": world}
    top = json.dumps({**head, "distributedInfo": info})[:-1]  # without its closing brace
    with gzip.open(folder / f"rank-{rank}.pt.trace.json.gz", "wt", compresslevel=1) as out:
        out.write(f'{top}, "traceEvents": {events_text}}}\n')


def _stretched(events: list, stretch: float) -> list:
    """Every event of the rank takes ``stretch`` times as long, from its first event on."""
    start = min(e["ts"] for e in events if isinstance(e.get("ts"), (int, float)))
    out = []
    for event in events:
        event = dict(event)
        if isinstance(event.get("ts"), (int, float)):
            event["ts"] = start + (event["ts"] - start) * stretch
        if isinstance(event.get("dur"), (int, float)):
            event["dur"] *= stretch
        out.append(event)
    return out


def build_many_ranks(
    folder: Path, realtraces: Path, ranks: int = 16, slow_rank: int = 9, stretch: float = 1.35
):
    """Write the run into ``folder``; returns its summary."""
    folder.mkdir(parents=True, exist_ok=True)
    source = realtraces / SOURCE
    with gzip.open(source, "rt") as fh:
        trace = json.load(fh)
    events = trace.pop("traceEvents")
    normal, slow = json.dumps(events), json.dumps(_stretched(events, stretch))  # once, not once a rank
    for rank in range(ranks):
        _write_rank(folder, rank, ranks, trace, slow if rank == slow_rank else normal)
    section = analyse_trace(str(source))
    steps = [s["duration_ms"] for s in section["steps"]]
    waits = [s["categories_ms"]["dataloader"] for s in section["steps"]]
    series = [steps[i % len(steps)] for i in range(STEPS)]
    wait_series = [waits[i % len(waits)] for i in range(STEPS)]
    summary = RunSummary(
        run_name=folder.name,
        log_dir=str(folder),
        world_size=ranks,
        timing=TimingSummary(
            steps=STEPS,
            step_time_ms=Distribution.of(series),
            data_wait_ms=Distribution.of(wait_series),
            compute_ms=Distribution.of([s - w for s, w in zip(series, wait_series, strict=True)]),
            data_wait_pct=100.0 * sum(wait_series) / sum(series),
            step_samples_ms=series,
            wait_samples_ms=wait_series,
        ),
        settings=Settings(num_workers=4, world_size=ranks, accelerator="cuda", strategy="ddp", batch_size=32),
        ranks=[
            RankStats(
                rank=rank,
                host=f"node{rank // 8}",
                step_time_ms=section["average"]["duration_ms"] * (stretch if rank == slow_rank else 1.0),
                data_wait_ms=section["average"]["categories_ms"]["dataloader"],
                node_rank=rank // 8,
            )
            for rank in range(ranks)
        ],
        trace_ranks=list(range(ranks)),
    )
    summary.findings = diagnose(summary)
    summary.save(os.path.join(folder, "perf_summary.json"))
    return summary
