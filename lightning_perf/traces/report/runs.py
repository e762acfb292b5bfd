"""The traces of ``lightning-perf report`` by run: a folder holding the traces of two runs (copied together, or
two fits given one ``dirpath``) gets a cross-rank view a run, never one table of both, and a note that it mixes
runs. torch's trace headers name no run (``trace_id`` is a trace's own), so a run is told by its world size
(``distributedInfo``), which every rank of a run shares."""

from __future__ import annotations

from typing import Any

from lightning_perf.traces.report.ranks import rank_spread


def group_runs(sections: list[dict[str, Any]]) -> dict[int | None, list[dict[str, Any]]]:
    """The trace sections by run, in the order met. torch's trace headers name no run (``trace_id`` is a
    trace's own), so a run is told by its world size (``distributedInfo``): every rank of a run has the same.
    Runs of one world size in one folder are not told apart; one group for a folder of one run."""
    runs: dict[int | None, list[dict[str, Any]]] = {}
    for section in sections:
        runs.setdefault(section["world_size"], []).append(section)
    return runs


def _run_label(world_size: int | None) -> str:
    return "no world size recorded" if world_size is None else f"world size {world_size}"


def mixed_runs_note(run_dir: str, runs: dict[int | None, list[dict[str, Any]]]) -> str:
    parts = "; ".join(
        f"{_run_label(size)}: {len(group)} trace{'s' if len(group) != 1 else ''}"
        for size, group in runs.items()
    )
    return (
        f"{run_dir} mixes the traces of {len(runs)} runs ({parts}): each run gets its own cross-rank view, "
        "never one table of both; keep each run's traces in a folder of its own (runs of one world size in "
        "one folder cannot be told apart)"
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
