"""Writing to the Trainer's loggers and TensorBoard run: scalars, text, HParams, custom-scalar layout."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning_perf import console
from lightning_perf.analysis import metrics as registry

log = console.logger(__name__)


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


# TensorBoard's Custom Scalars tab: one chart per concern, every run drawn in it
CUSTOM_SCALARS_LAYOUT = registry.custom_scalars_layout()


def disable_default_hp_metric(trainer: Any) -> bool:
    """Stop Lightning writing ``hp_metric=-1`` hparams at fit start; True when we did.

    TensorBoard keeps the first hparams summary of a run and ignores later ones (Lightning issues 8175, 1778),
    so the fingerprint and results written at the end of fit would never show if Lightning's placeholder came
    first. This is the documented ``TensorBoardLogger(default_hp_metric=False)`` route; ``hparams.yaml`` and the
    user's own hyperparameters are untouched, and are written again with ours at the end.
    """
    logger = tensorboard_logger(trainer)
    if logger is None or not getattr(logger, "_default_hp_metric", False):
        return False
    logger._default_hp_metric = False
    return True


def write_hparams(trainer: Any, summary: Any, hp_metric_placeholder: bool) -> bool:
    """Put the settings fingerprint and headline results in the HParams tab, beside the user's hyperparameters."""
    logger = tensorboard_logger(trainer)
    if logger is None or not trainer.is_global_zero:
        return False
    from lightning.fabric.utilities.logger import _flatten_dict
    from torch.utils.tensorboard.summary import hparams

    try:
        # the user's hyperparameters exactly as Lightning would write them, then ours
        params = logger._sanitize_params(_flatten_dict(dict(logger.hparams)))
        for name, value in vars(summary.settings).items():
            if value is not None:
                params[f"perf/{name}"] = value if isinstance(value, (bool, int, float, str)) else str(value)
        from lightning_perf.analysis.comparison import headline_metrics

        metrics = {
            registry.summary_metric(key).tag: value for key, value in headline_metrics(summary).items()
        }
        if hp_metric_placeholder:
            metrics.setdefault("hp_metric", -1.0)
        step = trainer.global_step
        logger.log_metrics(metrics, step=step)
        writer = logger.experiment._get_file_writer()
        for proto in hparams(params, metrics):
            writer.add_summary(proto, step)
        logger.experiment.flush()
    except Exception as err:
        log.warning("lightning-perf: could not write the HParams summary: %s", err)
        return False
    return True


def write_custom_scalars_layout(trainer: Any) -> None:
    logger = tensorboard_logger(trainer)
    if logger is None or not trainer.is_global_zero:
        return
    try:
        logger.experiment.add_custom_scalars(CUSTOM_SCALARS_LAYOUT)
    except Exception as err:
        log.warning("lightning-perf: could not write the custom scalars layout: %s", err)


def log_num_workers_probe(trainer: Any, probe: Mapping[str, Any]) -> None:
    """The probe as a table in the Text tab: its x axis is num_workers, not the step, so it is no chart."""
    from lightning_perf.analysis.findings_render import render_probe_markdown

    add_text(trainer, registry.PROBE_TEXT.tag, render_probe_markdown(probe), trainer.global_step)
