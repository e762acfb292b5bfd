"""The panes that read more than a summary, each computed only when the page opens it: one trace's tables
(``lightning-perf report``'s :func:`analyse_trace`), the cross-rank table of a run's traces (its
:func:`build_report`), and runs compared (``lightning-perf compare``'s :func:`compare`). A trace's analysis is
kept while its file is unchanged, so switching panes does not read it again. Every file is passed by
:func:`.safe_files.refusal` before it is opened."""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

from lightning_perf.analysis.run_discovery import HPARAMS_FILENAME, load_hparams, load_summary
from lightning_perf.analysis.summary import SUMMARY_FILENAME
from lightning_perf.analysis.verdicts.comparison import CompareError, compare
from lightning_perf.analysis.verdicts.comparison_render import _cells, load_comparison, to_json
from lightning_perf.tensorboard_plugin.cache import cached, stamp
from lightning_perf.tensorboard_plugin.runs import UnknownRun, load, run_dir, traces
from lightning_perf.tensorboard_plugin.safe_files import checked, refusal
from lightning_perf.traces.report.build import analyse_trace, build_report
from lightning_perf.trial.spec import COMPARISON_FILENAME

# Operators and kernels a trace pane lists (sorted on the page): the report's 10 hides too much for a table one
# can sort, every operator of a long trace is more than a page wants.
TOP = 100


def trace_pane(logdir: str, run: str, name: str) -> dict[str, Any]:
    """One trace of the run: step breakdown (torch-tb-profiler's categories), operators and kernels with their
    calls, self and total time, its figures and findings, as ``lightning-perf report --format json`` has them."""
    directory = run_dir(logdir, run)
    summary = load(directory)
    path = checked(directory, name)  # first, to say why: a symlink out, a FIFO
    if name not in {t["file"] for t in traces(directory, summary)}:
        raise UnknownRun(f"no trace {name!r} in run {run!r}")
    return cached.get(
        ("trace", stamp(path)),
        lambda: analyse_trace(path, top=TOP, with_input_rule=False, settings=summary.settings),
    )


def trace_ranks_pane(logdir: str, run: str) -> dict[str, Any]:
    """Every trace of the run read (as ``lightning-perf report RUN_DIR`` reads them): the cross-rank table with
    the straggler and the ranks that stand out, each trace's headline, unreadable files and notes."""
    directory = run_dir(logdir, run)
    paths = [os.path.join(directory, t["file"]) for t in traces(directory, load(directory))]
    report = cached.get(
        ("ranks", tuple(stamp(p) for p in paths)),
        lambda: build_report(directory, top=TOP, skip=lambda path: refusal(directory, path)),
    )
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
    for directory in directories:
        checked(directory, SUMMARY_FILENAME)  # a summary the tab may not open: 404, before any open
    summaries = [load_summary(d) for d in directories]
    # hyperparameters are optional: a refused hparams.yaml (a FIFO would hang the YAML reader) is none
    hparams = [
        None if refusal(d, os.path.join(d, HPARAMS_FILENAME)) else load_hparams(d) for d in directories
    ]
    comparison = compare(summaries, list(names), baseline=list(names).index(baseline), hparams=hparams)
    return _with_cells(comparison)


def _with_cells(comparison: Any) -> dict[str, Any]:
    return {
        **to_json(comparison),
        "cells": {row.key: _cells(comparison, row) for row in comparison.metrics},
    }


def trials_pane(logdir: str) -> list[dict[str, Any]]:
    """Every trial under the log dir (a ``comparison.json``: ``lightning-perf trial``'s, or one ``compare
    --format json`` wrote): its folder, the comparison with its rounds, or why it cannot be read."""
    found = []
    root = os.path.abspath(logdir)
    for directory, _, files in sorted(os.walk(root)):
        if COMPARISON_FILENAME not in files:
            continue
        path = os.path.join(directory, COMPARISON_FILENAME)
        name = os.path.relpath(directory, root).replace(os.sep, "/")
        why = refusal(directory, path)
        if why is not None:
            found.append({"name": name, "error": f"{path}: {why}"})
            continue
        try:
            comparison = cached.get(("trial", stamp(path)), functools.partial(load_comparison, path))
            found.append({"name": name, **_with_cells(comparison)})
        except (CompareError, OSError) as err:
            found.append({"name": name, "error": str(err)})
        except Exception as err:  # a comparison of the right shape whose values are not: its row only
            found.append(
                {"name": name, "error": f"{path}: malformed comparison: {type(err).__name__}: {err}"}
            )
    return found
