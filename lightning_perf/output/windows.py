"""Logging windows: every ``log_every_n_steps`` batches, the step clock's and the sampler's figures, reduced
across ranks, go to the Trainer's loggers at ``trainer.global_step``."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from lightning_perf import console
from lightning_perf.analysis.metrics import EVENTS_TEXT
from lightning_perf.collect.rank_exchange import WINDOW, RankReducer, reduce_window
from lightning_perf.collect.steps.step_clock import EPOCH_START_MS, STEP_TIME_MS
from lightning_perf.output import loggers

log = console.logger(__name__)

if TYPE_CHECKING:
    from lightning.pytorch import Trainer

    from lightning_perf.collect.config import PerfConfig
    from lightning_perf.collect.run_state import PerfSession


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
    metrics = session.clock.take_window()
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
