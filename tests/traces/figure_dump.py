"""Every figure the report and the analyses produce on one trace, as canonical JSON: the fixtures of
tests/traces/test_figures_unchanged.py.

The dumps in tests/traces/fixtures/ were written by this script with the code of main at commit 3029584 (the
reader before typed decoding); the test recomputes them with today's code and compares exactly: floats are
written by ``repr`` (every bit), the parsed spans by a digest of their ``repr`` in order.

Usage (writes one ``<folder>.json`` per folder of tests/data/realtraces):
    PYTHONPATH=$PWD python tests/traces/figure_dump.py [OUTDIR]
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from lightning_perf.traces.figures.analysis import (
    cpu_operator_stats,
    kernel_busy_pct,
    kernel_stats,
    step_breakdown,
)
from lightning_perf.traces.figures.gpu_figures import trace_figures
from lightning_perf.traces.read.loader import load_trace
from lightning_perf.traces.report.build import build_report, find_traces

FIXTURES = Path(__file__).resolve().parent / "fixtures"
REALTRACES = Path(__file__).resolve().parents[1] / "data" / "realtraces"


def _digest(items: list[Any]) -> str:
    sha = hashlib.sha256()
    for item in items:
        sha.update(repr(item).encode())
        sha.update(b"\n")
    return sha.hexdigest()


def _plain(value: Any, folder: str) -> Any:
    """JSON-ready, paths made independent of the checkout's place."""
    if isinstance(value, float):
        return repr(value)  # every bit, nan and inf included
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return {str(k): _plain(v, folder) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, folder) for v in value]
    if isinstance(value, str):
        return value.replace(folder, "<folder>")
    return value


def dump(folder: Path) -> dict[str, Any]:
    """Every figure of the one trace in ``folder``: the parsed data, the analyses unrounded, the report."""
    (path,) = find_traces(str(folder))
    parsed = load_trace(path)
    breakdown = step_breakdown(parsed.spans)
    root = str(folder)
    return _plain(
        {
            "parsed": {
                "metadata": parsed.metadata,
                "event_count": parsed.event_count,
                "spans": len(parsed.spans),
                "spans_sha256": _digest(parsed.spans),
                "memory": len(parsed.memory),
                "memory_sha256": _digest(parsed.memory),
                "memory_has_totals": parsed.memory_has_totals,
                "skipped_events": parsed.skipped_events,
                "skip_reason": parsed.skip_reason,
                "rank": parsed.rank,
            },
            "breakdown": {
                "steps": [dataclasses.asdict(s) for s in breakdown.steps],
                "average": breakdown.average() if breakdown.steps else None,
                "device_aligned": breakdown.device_aligned,
                "dropped_tail_steps": breakdown.dropped_tail_steps,
            },
            "kernel_busy_pct": kernel_busy_pct(parsed.spans),
            "cpu_operator_stats": cpu_operator_stats(parsed.spans),
            "kernel_stats": kernel_stats(parsed.spans),
            # what the callback's end of fit reads of each of its cycles (output/trace_findings.read_cycles)
            "trace_figures": trace_figures(load_trace(path)),
            "report": build_report(root),
        },
        root,
    )


def canonical(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def as_in(now, expected):
    """``now`` with only the keys ``expected`` has: keys added since the dump (e.g. a trace's ``backend``, from
    the cross-rank view) are new figures, not changed ones; every key of the dump must still be there."""
    if isinstance(expected, dict) and isinstance(now, dict):
        return {k: as_in(now[k], v) if k in now else now.get(k, "<missing>") for k, v in expected.items()}
    if isinstance(expected, list) and isinstance(now, list) and len(now) == len(expected):
        return [as_in(n, e) for n, e in zip(now, expected, strict=True)]
    return now


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else FIXTURES
    out.mkdir(parents=True, exist_ok=True)
    for folder in sorted(p for p in REALTRACES.iterdir() if p.is_dir()):
        (out / f"{folder.name}.json").write_text(canonical(dump(folder)))
        print(f"wrote {out / folder.name}.json")


if __name__ == "__main__":
    main()
