"""The end of a fit's ``compute_limit``: the step's FLOPs against the device's measured peak (MFU).

Called by :func:`lightning_perf.run_end.measure.build_summary` once training has ended, outside any step: the
peak (:mod:`lightning_perf.probes.device_peak`, cached per device and dtype) is measured only for a finished fit
with FLOPs to set against it. :func:`log_mfu_series` draws the MFU of every step in TensorBoard.
"""

from __future__ import annotations

from time import perf_counter
from typing import Any

from lightning_perf import console
from lightning_perf.analysis import metrics
from lightning_perf.analysis.compute.limit import compute_limit, run_dtype
from lightning_perf.analysis.rules.helpers import others_busy
from lightning_perf.analysis.summary import RunSummary
from lightning_perf.collect.run_state import PerfSession
from lightning_perf.collect.steps.step_clock import STEP_TIME_MS
from lightning_perf.output import loggers
from lightning_perf.output.end_of_run import bulk_writes
from lightning_perf.probes import device_peak

log = console.logger(__name__)


def attach(trainer: Any, session: PerfSession, summary: RunSummary) -> None:
    """``summary.compute_limit`` from the step's FLOPs, the device's peak and the mean step time; never raises."""
    step = session.flops
    if step is None:
        return
    try:
        peak, started = None, perf_counter()
        device = trainer.strategy.root_device
        dtype = run_dtype(
            summary.settings.precision, summary.settings.float32_matmul_precision, device.type == "cuda"
        )
        # rank zero's summary is the one written: other ranks on the same CPU would only time each other
        # the devices its timing knows how to wait for (CUDA's synchronize)
        measurable = dtype is not None and device.type in ("cpu", "cuda")
        if step.flops > 0 and summary.status == "finished" and measurable and trainer.is_global_zero:
            # a run that had the machine to itself measures again a peak cached as taken beside others' work
            quiet = summary.machine is not None and not others_busy(summary)
            peak = device_peak.peak(device, dtype, quiet_run=quiet)
        step_ms = summary.timing.step_time_ms
        summary.compute_limit = compute_limit(step, peak, step_ms.mean if step_ms else None)
        summary.compute_limit.peak_seconds = 0.0 if peak is None or peak.cached else perf_counter() - started
    except Exception as err:  # the run's own outcome wins
        log.warning(f"lightning-perf: could not work out the MFU: {err}")
        return
    with bulk_writes(trainer):
        log_mfu_series(trainer, session, summary)


def log_mfu_series(trainer: Any, session: PerfSession, summary: RunSummary) -> int:
    """``perf_compute/mfu_pct`` at every point of the run's step series (TensorBoard, rank zero); the points
    written. None where the run's MFU was not computed (the peak is wrong), nor any point above 100%: a step
    cannot outrun the device, so such a point measures the peak's error. Never raises."""
    limit = summary.compute_limit
    measured = limit.peak if limit is not None and limit.mfu_pct is not None else None
    peak = measured.measured_flops_per_s if measured is not None else None
    logger = loggers.tensorboard_logger(trainer)
    if not peak or logger is None or not trainer.is_global_zero:
        return 0
    written = 0
    try:
        for point in session.series.points():
            step_ms = point.logged.get(STEP_TIME_MS) if point.logged is not None else point.step_ms
            if step_ms:
                mfu = limit.step.flops / (step_ms / 1e3) / peak * 100.0
                if mfu > 100.0:
                    continue
                logger.experiment.add_scalar(metrics.MFU.tag, mfu, global_step=point.step)
                written += 1
        logger.experiment.flush()
    except Exception as err:
        log.warning(f"lightning-perf: could not write the MFU series: {err}")
    return written
