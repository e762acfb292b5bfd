"""Writing to the Trainer's loggers and TensorBoard run: scalars, text, HParams, custom-scalar layout."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("lightning_perf")


def tensorboard_logger(trainer: Any) -> Any | None:
    """The Trainer's first TensorBoardLogger, or None."""
    from lightning.pytorch.loggers import TensorBoardLogger

    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            return logger
    return None


def log_metrics(trainer: Any, metrics: Mapping[str, float], step: int) -> None:
    """Send metrics to every logger of the Trainer (TensorBoard, CSV, W&B, ...); rank zero only."""
    if not metrics or not trainer.is_global_zero:
        return
    for logger in trainer.loggers:
        try:
            logger.log_metrics(dict(metrics), step=step)
        except Exception as err:  # a logger failing must not stop training
            log.warning("lightning-perf: %s could not log metrics: %s", type(logger).__name__, err)


def add_text(trainer: Any, tag: str, text: str, step: int) -> bool:
    """Write markdown text to the TensorBoard run (Text tab); False when there is no TensorBoard logger."""
    logger = tensorboard_logger(trainer)
    if logger is None or not trainer.is_global_zero:
        return False
    try:
        logger.experiment.add_text(tag, text, global_step=step)
        logger.experiment.flush()
    except Exception as err:
        log.warning("lightning-perf: could not write %r to TensorBoard: %s", tag, err)
        return False
    return True
