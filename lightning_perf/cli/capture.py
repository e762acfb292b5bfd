"""``lightning-perf capture RUN_DIR``: ask a running fit to record one profiler cycle at its next logging window.

It writes a request file into the run dir (:mod:`lightning_perf.collect.profiling.capture_request`); the fit's
PerfCallback takes it on rank zero at its next window, every rank records one cycle (warm-up + active batches),
and the fit's console says so. Plain files only: run it on a login node, in the container or on any machine
that sees the run dir. Exit codes: 0 the request is written; 2 RUN_DIR missing or not writable.
"""

from __future__ import annotations

import argparse
import os

from lightning_perf.analysis.summary import SUMMARY_FILENAME
from lightning_perf.cli.common import EXIT_OK, error
from lightning_perf.collect.profiling.capture_request import MAX_AGE_S, write_request
from lightning_perf.errors import LightningPerfError

HELP = "Ask a running fit (by its run dir) to record one profiler cycle at its next logging window."
PROG = "lightning-perf capture"


class CaptureError(LightningPerfError):
    """The request cannot be written; the message names the run dir."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir", metavar="RUN_DIR", help="the running fit's log dir (where its traces are written)"
    )


def run(args: argparse.Namespace) -> int:
    run_dir = args.run_dir
    if not os.path.isdir(run_dir):
        return error(PROG, CaptureError(f"{run_dir}: no such run dir"))
    try:
        path = write_request(run_dir)
    except OSError as err:
        return error(PROG, err)
    print(
        f"{PROG}: asked the fit logging to {run_dir} to record one profiler cycle at its next logging window "
        f"(request {path}; a fit that has not taken it within {MAX_AGE_S / 60:.0f} minutes ignores it)"
    )
    if os.path.exists(os.path.join(run_dir, SUMMARY_FILENAME)):
        print(f"{PROG}: note: {run_dir} already holds {SUMMARY_FILENAME}: the fit there may have ended")
    return EXIT_OK
