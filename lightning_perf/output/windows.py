"""Logging windows: every ``log_every_n_steps`` batches, the step clock's and the sampler's figures, reduced
across ranks, go to the Trainer's loggers at ``trainer.global_step``; at the end of a fit, the whole run's
per-step series goes to TensorBoard under the same tags (:func:`write_step_series`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from lightning_perf import console
from lightning_perf.analysis.metrics import EVENTS_TEXT
from lightning_perf.collect.rank_exchange import WINDOW, RankReducer, reduce_window
from lightning_perf.collect.steps import hook_profiler
from lightning_perf.collect.steps.step_clock import (
    BATCHES_PER_SEC,
    COMPUTE_MS,
    DATA_WAIT_MS,
    DATA_WAIT_PCT,
    EPOCH_START_MS,
    SAMPLES_PER_SEC,
    STEP_TIME_MS,
)
from lightning_perf.output import loggers

log = console.logger(__name__)

# the step clock's per-step figures: the tags of the end-of-fit step series (write_step_series)
SERIES_TAGS = (STEP_TIME_MS, BATCHES_PER_SEC, DATA_WAIT_MS, DATA_WAIT_PCT, COMPUTE_MS, SAMPLES_PER_SEC)

if TYPE_CHECKING:
    from lightning.pytorch import Trainer

    from lightning_perf.collect.config import PerfConfig
    from lightning_perf.collect.run_state import PerfSession
    from lightning_perf.collect.steps.step_clock import StepClock
    from lightning_perf.collect.steps.step_series import StepPoint


def flush(
    trainer: Trainer,
    session: PerfSession,
    sampled: dict[str, Any],
    reducer: RankReducer | None,
    log_every: int,
    config: PerfConfig,
) -> int:
    """Log the window that just ended; returns how many batches the next window holds.

    ``reducer`` is given when every rank flushes here together (the gather is a collective).
    """
    session.series.add_window(*session.clock.window_samples(), trainer.global_step)
    metrics = session.clock.take_window()
    if session.hooks is not None:
        metrics.update(
            hook_profiler.window_anatomy(session.hooks, metrics.get(STEP_TIME_MS), metrics.get(DATA_WAIT_MS))
        )
    metrics.update(sampled)
    if session.compiles is not None:
        metrics.update(session.compiles.take_window())
    if reducer is not None and reducer.distributed:
        per_rank = reducer.gather(WINDOW, metrics)  # on every rank, before any rank-zero check
        if per_rank is not None:
            metrics.update(reduce_window(per_rank))
    epoch_start = session.clock.last_epoch_start_ms
    if epoch_start is not None:
        metrics[EPOCH_START_MS] = epoch_start
        session.clock.last_epoch_start_ms = None
    loggers.log_metrics(trainer, metrics, trainer.global_step)
    session.series.window_logged(trainer.global_step, {t: metrics[t] for t in SERIES_TAGS if t in metrics})
    if session.watch is not None:  # the slowdown check and extra profiler cycles (collect.long_run)
        for event in session.watch.at_window(
            metrics, trainer.global_step, session.window, session.batches, reducer
        ):
            log.info(event)
            loggers.add_text(trainer, EVENTS_TEXT.tag, event, trainer.global_step)
    return stretched_window(metrics.get(STEP_TIME_MS), log_every, config.log_min_interval_s)


def stretched_window(step_time_ms: float | None, log_every: int, min_interval_s: float) -> int:
    """Batches in the next window: a multiple of log_every_n_steps lasting >= ``min_interval_s``.

    Logging costs the training thread (TensorBoard's writer takes ~0.1 ms a scalar), so sub-millisecond steps
    would otherwise pay several percent. Under DDP ``step_time_ms`` is the gathered mean, the same number on
    every rank, so all ranks keep the same windows and meet in the same gathers.
    """
    if not step_time_ms or min_interval_s <= 0:
        return log_every
    window_s = log_every * step_time_ms / 1e3
    return log_every * max(1, math.ceil(min_interval_s / window_s))


def write_step_series(trainer: Trainer, session: PerfSession) -> int:
    """The whole run's step series into the TensorBoard run, under the windows' own tags; the points written.

    A short run's chart then shows every step (a 64-step run at ``log_every_n_steps=50`` has two windows), a
    long one's its shape: every step up to a cap, then evenly thinned to at most
    :data:`~lightning_perf.collect.steps.step_series.MAX_POINTS` (``collect.steps.step_series``). In step order,
    the windows' points written again exactly as logged: TensorBoard's data server drops a tag's later points
    when an earlier step arrives, so each tag ends with one value per step, the window's where it logged one.
    Between windows these are rank zero's own steps (under DDP the windows log the mean over ranks).
    TensorBoard only: the other loggers keep their windows (W&B, for one, refuses steps that go back). Rank
    zero; never raises.
    """
    logger = loggers.tensorboard_logger(trainer)
    if logger is None or not trainer.is_global_zero:
        return 0
    try:
        from tensorboard.compat.proto.summary_pb2 import Summary
        from torch.utils.tensorboard.summary import scalar

        writer = logger.experiment._get_file_writer()
        points = session.series.points()
        for point in points:
            values = point.logged if point.logged is not None else _step_values(point, session.clock)
            if values:
                summary = Summary(
                    value=[v for tag, value in values.items() for v in scalar(tag, value).value]
                )
                writer.add_summary(summary, point.step)
        logger.experiment.flush()
    except Exception as err:
        log.warning(f"lightning-perf: could not write the run's step series: {err}")
        return 0
    return len(points)


def _step_values(point: StepPoint, clock: StepClock) -> dict[str, float]:
    values = {STEP_TIME_MS: point.step_ms, BATCHES_PER_SEC: 1e3 / point.step_ms}
    if clock.measure_data_wait:
        values[DATA_WAIT_MS] = point.wait_ms
        values[DATA_WAIT_PCT] = point.wait_ms / point.step_ms * 100.0
        values[COMPUTE_MS] = point.step_ms - point.wait_ms
    if point.samples >= 0:
        values[SAMPLES_PER_SEC] = point.samples / point.step_ms * 1e3
    return values
