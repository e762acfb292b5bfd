"""The traces of ``lightning-perf report`` by run: a folder holding the traces of two runs (copied together, or
two fits given one ``dirpath``) gets a cross-rank view a run, never one table of both, and a note that it mixes
runs. torch's trace headers name no run (``trace_id`` is a trace's own), so a run is told by what its traces
share: its world size (``distributedInfo``), and a rank's process (the pid of its steps): the cycles of one run
come from one process a rank, a second run of the same world size from new ones."""

from __future__ import annotations

from typing import Any

from lightning_perf.traces.report.ranks import rank_spread

Runs = list[tuple[int | None, list[dict[str, Any]]]]


def group_runs(sections: list[dict[str, Any]]) -> Runs:
    """The trace sections by run, as (world size, sections), in the order met.

    Within a world size, each rank's processes are taken in the order they started (``process``, ``started_us``
    of a section): a rank's first process is in the first run, its second in the second, and so on; the traces
    of one process (its cycles) stay together. A trace whose process is unknown goes with its rank's first."""
    by_size: dict[int | None, list[dict[str, Any]]] = {}
    for section in sections:
        by_size.setdefault(section["world_size"], []).append(section)
    runs: Runs = []
    for size, group in by_size.items():
        first_start: dict[tuple[Any, Any], float] = {}
        for section in group:
            key = (section["rank"], section.get("process"))
            start = section.get("started_us")
            start = float("inf") if start is None else start
            first_start[key] = min(first_start.get(key, start), start)
        order: dict[tuple[Any, Any], int] = {}
        for rank in {rank for rank, _ in first_start}:
            known = sorted((t, str(p)) for (r, p), t in first_start.items() if r == rank and p is not None)
            for index, (_, name) in enumerate(known):
                order[(rank, name)] = index
        parts: dict[int, list[dict[str, Any]]] = {}
        for section in group:
            process = section.get("process")
            index = 0 if process is None else order[(section["rank"], str(process))]
            parts.setdefault(index, []).append(section)
        runs += [(size, parts[index]) for index in sorted(parts)]
    return runs


def _run_label(world_size: int | None) -> str:
    return "no world size recorded" if world_size is None else f"world size {world_size}"


def mixed_runs_note(run_dir: str, runs: Runs) -> str:
    parts = "; ".join(
        f"{_run_label(size)}: {len(group)} trace{'s' if len(group) != 1 else ''}" for size, group in runs
    )
    return (
        f"{run_dir} mixes the traces of {len(runs)} runs ({parts}): each run gets its own cross-rank view, "
        "never one table of both; keep each run's traces in a folder of its own (runs are told apart by their "
        "world size and their ranks' processes)"
    )


def run_entry(number: int, world_size: int | None, group: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "run": number,
        "world_size": world_size,
        "files": [section["file"] for section in group],
        "ranks": rank_spread(group),
    }


def run_reports(report: dict[str, Any]) -> list[dict[str, Any]]:
    """:func:`build_report`'s report a run (``report["runs"]``), each with its own traces, cross-rank view and
    extra cycles, to render one after the other; the folder's notes, unreadable files and summary go with the
    first. ``[report]`` for a folder of one run."""
    runs = report.get("runs") or []
    parts = []
    for index, run in enumerate(runs):
        files, first = set(run["files"]), index == 0
        title = f"{report['run_dir']} (run {run['run']} of {len(runs)}: {_run_label(run['world_size'])})"
        parts.append(
            {
                **report,
                "run_dir": title,
                "summary": report["summary"] if first else None,
                "notes": report["notes"] if first else [],
                "unreadable": report["unreadable"] if first else [],
                "findings": report["findings"] if first else [],
                "traces": [t for t in report["traces"] if t["file"] in files],
                "ranks": run["ranks"],
                "changes": [c for c in report["changes"] if c["file"] in files],
                "runs": [],
            }
        )
    return parts or [report]
