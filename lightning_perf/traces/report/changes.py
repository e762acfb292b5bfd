"""The report's "what changed" view: each extra profiler cycle (recorded on a slowdown, or on
``lightning-perf capture``) set beside the run's first scheduled cycle of the same rank, category by category of
the step breakdown (DataLoader, CPU Exec, Kernel, ...: :data:`lightning_perf.traces.figures.breakdown.CATEGORIES`).

Extra cycles are known by their file name: ``<worker>_slowdown.<ns>.pt.trace.json.gz`` and
``<worker>_capture.<ns>...`` (:mod:`lightning_perf.collect.steps.long_run`).
"""

from __future__ import annotations

from typing import Any

from lightning_perf.traces.figures.breakdown import CATEGORIES, CATEGORY_LABELS

EXTRA_LABELS = ("slowdown", "capture")


def extra_label(file: str) -> str | None:
    """``"slowdown"`` or ``"capture"`` for an extra cycle's trace, else None."""
    worker = file.split(".", 1)[0]
    return next((label for label in EXTRA_LABELS if worker.endswith(f"_{label}")), None)


def cycle_changes(sections: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per extra cycle: its mean step and categories beside the first scheduled cycle's (same rank)."""
    firsts: dict[Any, dict[str, Any]] = {}
    for section in sections:
        if extra_label(section["file"]) is None and section["average"]:
            firsts.setdefault(section["rank"], section)
    changes = []
    for section in sections:
        label = extra_label(section["file"])
        first = firsts.get(section["rank"])
        if label is None or first is None or not section["average"]:
            continue
        before, after = first["average"], section["average"]
        rows = [("total", before["duration_ms"], after["duration_ms"])]
        rows += [(c, before["categories_ms"][c], after["categories_ms"][c]) for c in CATEGORIES]
        changes.append(
            {
                "label": label,
                "file": section["file"],
                "first_file": first["file"],
                "rank": section["rank"],
                "steps": [s["step"] for s in section["steps"]],
                "first_steps": [s["step"] for s in first["steps"]],
                "rows": [
                    {"category": c, "first_ms": a, "extra_ms": b, "change_ms": _delta(a, b)}
                    for c, a, b in rows
                ],
            }
        )
    return changes


def _delta(first: float | None, extra: float | None) -> float | None:
    return None if first is None or extra is None else round(extra - first, 3)


def change_title(change: dict[str, Any]) -> str:
    def span(steps: list[Any]) -> str:
        known = [s for s in steps if s is not None]
        return f"steps {known[0]}-{known[-1]}" if known else "steps ?"

    rank = "" if change["rank"] is None else f", rank {change['rank']}"
    return (
        f"What changed ({change['label']} cycle{rank}): {change['file']} ({span(change['steps'])}) beside the "
        f"first cycle {change['first_file']} ({span(change['first_steps'])}), mean ms per step"
    )


def change_rows(change: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The rows that changed or matter (the total, and every category with time in either cycle)."""
    rows = []
    for row in change["rows"]:
        first, extra, delta = row["first_ms"], row["extra_ms"], row["change_ms"]
        if row["category"] != "total" and not (first or extra):
            continue
        name = "Step" if row["category"] == "total" else CATEGORY_LABELS[row["category"]]
        rows.append([name, _fmt(first), _fmt(extra), "-" if delta is None else f"{delta:+.2f}"])
    return ["Category", "First", "Extra", "Change"], rows


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
