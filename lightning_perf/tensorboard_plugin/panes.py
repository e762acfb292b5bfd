"""The panes that read more than a summary, each computed only when the page opens it: one trace's tables
(``lightning-perf report``'s :func:`analyse_trace`), the cross-rank table of a run's traces (its
:func:`build_report`), and runs compared (``lightning-perf compare``'s :func:`compare`). A trace's analysis is
kept while its file is unchanged, so switching panes does not read it again."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from lightning_perf.analysis.run_discovery import load_hparams, load_summary
from lightning_perf.analysis.summary import RunSummary
from lightning_perf.analysis.verdicts.comparison import CompareError, compare
from lightning_perf.analysis.verdicts.comparison_render import _cells, to_json
from lightning_perf.tensorboard_plugin.runs import UnknownRun, run_dir, traces
from lightning_perf.traces.report.build import analyse_trace, build_report

# Operators and kernels a trace pane lists (sorted on the page): the report's 10 hides too much for a table one
# can sort, every operator of a long trace is more than a page wants.
TOP = 100
# Trace analyses kept in memory: a few hundred KiB each.
_CACHE_SIZE = 64


class _Cache:
    """Results by key, least recently used dropped first; one computation at a time a key is not needed
    (TensorBoard serves a pane once a click), so the lock guards the dict only."""

    def __init__(self, size: int = _CACHE_SIZE) -> None:
        self._items: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._size = size

    def get(self, key: Any, make: Callable[[], Any]) -> Any:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = make()
        with self._lock:
            self._items[key] = value
            while len(self._items) > self._size:
                self._items.popitem(last=False)
        return value


_cache = _Cache()


def _stamp(path: str) -> tuple[str, int, int]:
    """What tells a changed file from the one analysed: its path, size and modification time."""
    info = os.stat(path)
    return (os.path.realpath(path), info.st_size, info.st_mtime_ns)


def trace_pane(logdir: str, run: str, name: str) -> dict[str, Any]:
    """One trace of the run: step breakdown (torch-tb-profiler's categories), operators and kernels with their
    calls, self and total time, its figures and findings, as ``lightning-perf report --format json`` has them."""
    directory = run_dir(logdir, run)
    summary = RunSummary.load(directory)
    if name not in {t["file"] for t in traces(directory, summary)}:
        raise UnknownRun(f"no trace {name!r} in run {run!r}")
    path = os.path.join(directory, name)
    return _cache.get(
        ("trace", _stamp(path)),
        lambda: analyse_trace(path, top=TOP, with_input_rule=False, settings=summary.settings),
    )


def trace_ranks_pane(logdir: str, run: str) -> dict[str, Any]:
    """Every trace of the run read (as ``lightning-perf report RUN_DIR`` reads them): the cross-rank table with
    the straggler and the ranks that stand out, each trace's headline, unreadable files and notes."""
    directory = run_dir(logdir, run)
    paths = [os.path.join(directory, t["file"]) for t in traces(directory, RunSummary.load(directory))]
    report = _cache.get(("ranks", tuple(_stamp(p) for p in paths)), lambda: build_report(directory, top=TOP))
    return {
        "ranks": report["ranks"],
        "runs": [{k: v for k, v in r.items() if k != "ranks"} for r in report["runs"]],
        "traces": [
            {
                "file": t["file"],
                "rank": t["rank"],
                "world_size": t["world_size"],
                "steps": len(t["steps"]),
                "step_ms": (t["average"] or {}).get("duration_ms"),
                "findings": len(t["findings"]),
            }
            for t in report["traces"]
        ],
        "notes": report["notes"],
        "unreadable": report["unreadable"],
    }


def compare_pane(logdir: str, names: Sequence[str], baseline: str) -> dict[str, Any]:
    """``lightning-perf compare`` of the runs ``names`` against ``baseline`` (one of them): its JSON (each
    metric's values, intervals and changes, the verdict, the settings and hyperparameters that differ) and
    each metric's cells as its text table prints them."""
    if len(names) < 2:
        raise CompareError("pick at least two runs to compare")
    if len(set(names)) != len(names):
        raise CompareError("a run is picked twice")
    if baseline not in names:
        raise CompareError(f"the baseline {baseline!r} is not among the runs picked")
    directories = [run_dir(logdir, name) for name in names]
    summaries = [load_summary(d) for d in directories]
    hparams = [load_hparams(d) for d in directories]
    comparison = compare(summaries, list(names), baseline=list(names).index(baseline), hparams=hparams)
    return {
        **to_json(comparison),
        "cells": {row.key: _cells(comparison, row) for row in comparison.metrics},
    }
