"""``lightning-perf capture RUN_DIR``: ask a running fit to record one profiler cycle at its next logging window.

It writes a request file into the run dir (:mod:`lightning_perf.collect.profiling.capture_request`); the fit's
PerfCallback takes it on rank zero at its next window, every rank records one cycle (warm-up + active batches),
and the fit's console says so. Plain files only: run it on a login node, in the container or on any machine
that sees the run dir. The fit watches its own run folder only (where its traces and ``perf_summary.json`` go),
so a folder that holds no run but has runs below it (``lightning_logs`` instead of ``lightning_logs/version_3``)
is refused, naming the run folders below it: a request there would never be taken. ``--force`` writes it
anyway. Exit codes: 0 the request is written; 2 RUN_DIR missing, not writable, or holding no run.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable

from lightning_perf.analysis.run_discovery import natural_key
from lightning_perf.analysis.summary import SUMMARY_FILENAME
from lightning_perf.cli.common import EXIT_OK, error, guard
from lightning_perf.collect.profiling.capture_request import MAX_AGE_S, write_request
from lightning_perf.errors import LightningPerfError
from lightning_perf.output.comparison_chart import TENSORBOARD_SUBDIR
from lightning_perf.traces.report.build import TORCH_SUFFIXES

HELP = "Ask a running fit (by its run dir) to record one profiler cycle at its next logging window."
PROG = "lightning-perf capture"
# Files a run's folder holds while the fit runs or after it: lightning-perf's (its summary, its traces) and
# Lightning's loggers' (TensorBoard's event files, the CSV logger's metrics, the saved hyperparameters).
RUN_FILES = (SUMMARY_FILENAME, "hparams.yaml", "metrics.csv")
RUN_FILE_PREFIXES = ("events.out.tfevents.",)
# How far below RUN_DIR to look for run folders (lightning_logs/<name>/version_N is two levels), and how many
# folders to look into at most (a command pointed at a home directory answers at once).
SEARCH_DEPTH = 3
SEARCH_FOLDERS = 2000
SHOWN_RUNS = 10


def _hidden_or_comparison(name: str) -> bool:
    return name.startswith(".") or name == TENSORBOARD_SUBDIR  # compare's TensorBoard run is no fit's


class CaptureError(LightningPerfError):
    """The request cannot be written; the message names the run dir."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir", metavar="RUN_DIR", help="the running fit's log dir (where its traces are written)"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="write the request even where RUN_DIR holds no run's files but has runs below it",
    )


def holds_run(names: Iterable[str]) -> bool:
    """Whether a folder with these file names is a run's: RUN_FILES, a TensorBoard event file, a trace."""
    return any(
        name in RUN_FILES or name.startswith(RUN_FILE_PREFIXES) or name.endswith(TORCH_SUFFIXES)
        for name in names
    )


def run_folders_below(root: str) -> list[str]:
    """The run folders below ``root`` (not ``root`` itself), at most SEARCH_DEPTH levels down, in natural
    order (``version_2`` before ``version_10``); a run's own subfolders are not searched."""
    found: list[str] = []
    level, looked = [root], 0
    for _ in range(SEARCH_DEPTH):
        below: list[str] = []
        for folder in level:
            try:
                entries = [e for e in os.scandir(folder) if e.is_dir() and not _hidden_or_comparison(e.name)]
            except OSError:
                continue
            for entry in entries:
                looked += 1
                if looked > SEARCH_FOLDERS:
                    return sorted(found, key=natural_key)
                try:
                    names = os.listdir(entry.path)
                except OSError:
                    continue
                (found if holds_run(names) else below).append(entry.path)
        level = below
    return sorted(found, key=natural_key)


def _not_a_run(run_dir: str) -> CaptureError | None:
    """Why no fit can be watching ``run_dir``: it holds no run's files but has run folders below it."""
    runs = run_folders_below(run_dir)
    if not runs:
        return None  # a fresh run dir (nothing written yet) or a dirpath of the user's choosing
    latest = max(runs, key=_modified)
    shown = ", ".join(runs[:SHOWN_RUNS]) + (
        f" and {len(runs) - SHOWN_RUNS} more" if len(runs) > SHOWN_RUNS else ""
    )
    return CaptureError(
        f"{run_dir}: holds no run (no {SUMMARY_FILENAME}, trace, TensorBoard event file or metrics.csv), so no "
        f"fit watches it for requests; the run folders below it: {shown} (the last written: {latest}). Give "
        "the running fit's own folder, or --force to write the request here anyway"
    )


def _modified(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def run(args: argparse.Namespace) -> int:
    return guard(PROG, lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    run_dir = args.run_dir
    if not os.path.isdir(run_dir):
        return error(PROG, CaptureError(f"{run_dir}: no such run dir"))
    try:
        is_run = holds_run(os.listdir(run_dir))
    except OSError:
        is_run = True  # unreadable: write_request says why
    refused = None if is_run or args.force else _not_a_run(run_dir)
    if refused is not None:
        return error(PROG, refused)
    try:
        path = write_request(run_dir)
    except OSError as err:
        return error(PROG, err)
    print(
        f"{PROG}: asked the fit logging to {run_dir} to record one profiler cycle at its next logging window "
        f"(request {path}; a fit that has not taken it within {MAX_AGE_S / 60:.0f} minutes ignores it)"
    )
    if not is_run:
        print(
            f"{PROG}: note: {run_dir} holds no run's files yet ({SUMMARY_FILENAME}, traces, TensorBoard event "
            "files, metrics.csv): if no fit logs there, the request expires unseen"
        )
    if os.path.exists(os.path.join(run_dir, SUMMARY_FILENAME)):
        print(f"{PROG}: note: {run_dir} already holds {SUMMARY_FILENAME}: the fit there may have ended")
    return EXIT_OK
