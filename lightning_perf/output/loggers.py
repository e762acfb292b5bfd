"""Writing to the Trainer's loggers: scalars to all; the TensorBoard run's text, HParams and custom-scalar
layout; the end of a fit to the other loggers (:mod:`lightning_perf.output.other_loggers`); the run dir."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import Any

from lightning_perf import console
from lightning_perf.analysis import metrics as registry
from lightning_perf.analysis.markdown import for_text_tab
from lightning_perf.analysis.probe_results import NumWorkersProbe
from lightning_perf.collect.namespaces import is_instance
from lightning_perf.output import hparams_experiment, hparams_tab, other_loggers

log = console.logger(__name__)


def tensorboard_logger(trainer: Any) -> Any | None:
    """The Trainer's first TensorBoardLogger (``lightning.pytorch`` or ``pytorch_lightning``), or None."""
    for logger in trainer.loggers:
        if is_tensorboard(logger):
            return logger
    return None


def is_tensorboard(logger: Any) -> bool:
    return is_instance(logger, "loggers", "TensorBoardLogger")


# the folder of runs without any logger, under default_root_dir (the working directory by default). Not the
# package's name: a folder ``lightning_perf`` there would be imported as an (empty) namespace package in place
# of an editable install, whose finder comes after the working directory on the import path (issue 36).
NO_LOGGER_DIR = "lightning_perf_logs"


def run_dir(trainer: Any) -> str:
    """This run's own folder for traces and perf_summary.json (call on rank zero, where loggers are real):
    the TensorBoard logger's log dir, else the first logger's run dir, else a new
    ``default_root_dir/lightning_perf_logs/version_N``. Never a folder another run writes to."""
    logger = tensorboard_logger(trainer)
    if logger is not None:
        return logger.log_dir
    for logger in trainer.loggers[:1]:
        found = logger_run_dir(logger, trainer.default_root_dir)
        if found:
            return found
    return new_version_dir(os.path.join(trainer.default_root_dir, NO_LOGGER_DIR))


def logger_run_dir(logger: Any, default_root_dir: str) -> str | None:
    """Where ``logger`` keeps this run's files: its ``log_dir`` (CSV), else ``save_dir/name/version``, where
    Lightning's ModelCheckpoint puts checkpoints for loggers without a log dir (MLflow, W&B); None for a logger
    without a run of its own (``fast_dev_run``'s DummyLogger)."""
    log_dir = getattr(logger, "log_dir", None)
    if isinstance(log_dir, str) and log_dir:
        return log_dir
    name, version = logger.name, logger.version
    if not name or version in (None, ""):
        return None
    version = version if isinstance(version, str) else f"version_{version}"
    return os.path.join(logger.save_dir or default_root_dir, str(name), version)


def new_version_dir(parent: str) -> str:
    """Create and return ``parent/version_N`` for the first N not taken (Lightning's loggers number their runs
    the same way; their helper is private, and creating the folder here reserves it against a parallel run)."""
    os.makedirs(parent, exist_ok=True)
    taken = [name[len("version_") :] for name in os.listdir(parent) if name.startswith("version_")]
    number = max((int(n) for n in taken if n.isdigit()), default=-1) + 1
    while True:
        path = os.path.join(parent, f"version_{number}")
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            number += 1


def publish_run_end(trainer: Any, summary: Any, markdown: str | None, summary_path: str | None) -> None:
    """The end of a fit for every logger that is not TensorBoard (whose writer is below); rank zero only."""
    others = [logger for logger in trainer.loggers if not is_tensorboard(logger)]
    if not others or not trainer.is_global_zero:
        return
    metrics = summary_metrics(summary)
    for logger in others:
        other_loggers.publish(logger, summary, metrics, trainer.global_step, markdown, summary_path)


def summary_metrics(summary: Any) -> dict[str, float]:
    from lightning_perf.analysis.verdicts.comparison import headline_metrics

    return {registry.summary_metric(key).tag: value for key, value in headline_metrics(summary).items()}


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
    """Write markdown text to the TensorBoard run (Text tab), rewritten for its renderer
    (:func:`~lightning_perf.analysis.markdown.for_text_tab`); False when there is no TensorBoard logger."""
    logger = tensorboard_logger(trainer)
    if logger is None or not trainer.is_global_zero:
        return False
    try:
        logger.experiment.add_text(tag, for_text_tab(text), global_step=step)
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
    if logger is None:
        return False
    if not hasattr(logger, "_default_hp_metric"):  # a Lightning version without it: say what is lost
        warnings.warn(
            "lightning-perf: this TensorBoardLogger has no `_default_hp_metric`; if Lightning writes its "
            "hp_metric placeholder first, the HParams tab will not show lightning-perf's settings and results "
            "(pass `TensorBoardLogger(default_hp_metric=False)` to avoid it).",
            stacklevel=3,
        )
        return False
    if not logger._default_hp_metric:
        return False
    logger._default_hp_metric = False
    return True


def restore_default_hp_metric(trainer: Any) -> None:
    logger = tensorboard_logger(trainer)
    if logger is not None:
        logger._default_hp_metric = True


def write_hparams(trainer: Any, summary: Any, hp_metric_placeholder: bool) -> bool:
    """Put the settings fingerprint and headline results in the HParams tab, beside the user's hyperparameters
    (:mod:`lightning_perf.output.hparams_tab`: speed settings first, values as they are).

    ``hp_metric`` is one of the tab's metrics only when the user logged it (Lightning's placeholder, which
    ``hp_metric_placeholder`` says was replaced, would show ``-1``). The headline results are scalars too (the
    tab reads metric values from them): a flat line from step 0 to the last step, the run's figure over the run,
    so the Scalars tab draws a line where a lone point looks like an empty chart.
    """
    logger = tensorboard_logger(trainer)
    if logger is None or not trainer.is_global_zero:
        return False
    try:
        # the user's hyperparameters exactly as Lightning would write them, then ours
        params = _user_hparams(logger)
        params.update(other_loggers.settings_params(summary))
        metrics = summary_metrics(summary)
        tags = list(metrics)
        if hp_metric_placeholder and hparams_tab.user_logs_hp_metric(trainer):
            tags.append(hparams_tab.USER_METRIC)
        step = trainer.global_step
        writer = logger.experiment
        if step > 0:
            for tag, value in metrics.items():
                writer.add_scalar(tag, value, global_step=0)
        logger.log_metrics(metrics, step=step)
        file_writer = writer._get_file_writer()
        values = hparams_tab.plain_values(params)
        for proto in hparams_tab.session_summaries(values):
            file_writer.add_summary(proto, step)
        writer.flush()
        # the columns: one experiment for every run of the logger's folder (output.hparams_experiment)
        hparams_experiment.save_values(logger.log_dir, values, tags)
        hparams_experiment.write_experiment(os.path.dirname(os.path.normpath(logger.log_dir)), METRIC_NAMES)
    except Exception as err:
        log.warning("lightning-perf: could not write the HParams summary: %s", err)
        return False
    return True


# the HParams tab's metric columns: display name and description (the unit in both)
METRIC_NAMES = {
    m.tag: (f"{m.label or m.name} ({m.unit})" if m.unit else m.label or m.name, m.meaning)
    for m in registry.SUMMARY_METRICS
}


def _user_hparams(logger: Any) -> dict[str, Any]:
    """The user's hyperparameters flattened and sanitised by Lightning's own (private) helpers."""
    try:
        from lightning.fabric.utilities.logger import _flatten_dict

        return logger._sanitize_params(_flatten_dict(dict(logger.hparams)))
    except (ImportError, AttributeError) as err:
        warnings.warn(
            f"lightning-perf: Lightning's hyperparameter helpers are missing ({err}); the HParams tab shows "
            "lightning-perf's settings and results without your own hyperparameters.",
            stacklevel=3,
        )
        return {}


def write_custom_scalars_layout(trainer: Any) -> None:
    logger = tensorboard_logger(trainer)
    if logger is None or not trainer.is_global_zero:
        return
    try:
        logger.experiment.add_custom_scalars(CUSTOM_SCALARS_LAYOUT)
    except Exception as err:
        log.warning("lightning-perf: could not write the custom scalars layout: %s", err)


def log_num_workers_probe(trainer: Any, probe: NumWorkersProbe) -> None:
    """The probe as a table in the Text tab: its x axis is num_workers, not the step, so it is no chart."""
    from lightning_perf.analysis.findings_render import render_probe_markdown

    add_text(trainer, registry.PROBE_TEXT.tag, render_probe_markdown(probe), trainer.global_step)
