"""The end of a fit's ``compute_limit``: the counted FLOPs of a step against the device's peak (MFU).

Called by :func:`lightning_perf.output.end_of_run.build_summary` once training has ended.
"""

from __future__ import annotations

from typing import Any

from lightning_perf import console
from lightning_perf.analysis.compute_limit import compute_limit
from lightning_perf.analysis.summary import RunSummary
from lightning_perf.collect.run_state import PerfSession

log = console.logger(__name__)


def attach(trainer: Any, session: PerfSession, summary: RunSummary) -> None:
    """``summary.compute_limit`` from the step's FLOPs and the mean step time; never raises."""
    if session.flops is None:
        return
    try:
        step_ms = summary.timing.step_time_ms
        summary.compute_limit = compute_limit(session.flops, None, step_ms.mean if step_ms else None)
    except Exception as err:  # the run's own outcome wins
        log.warning(f"lightning-perf: could not work out the MFU: {err}")
