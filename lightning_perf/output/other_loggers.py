"""The end of a fit for loggers other than TensorBoard (CSV, MLflow, W&B, any other), each through its own API.

Every logger gets the run's settings as hyperparameters (``log_hyperparams``) and the headline results as
metrics (``log_metrics``); then, where the logger has them:

* MLflow: the diagnosis as a text artifact (``MlflowClient.log_text``), the findings as a table
  (``log_dict``), ``perf_summary.json`` as an artifact (``log_artifact``);
* W&B: the findings as a table (``WandbLogger.log_table``), the headline results in the run summary,
  ``perf_summary.json`` as a run artifact (``wandb.Artifact``);
* CSV: ``perf_diagnosis.md`` and ``perf_findings.csv`` beside its ``metrics.csv``.

TensorBoard's own writer (text, HParams, custom scalars) is in :mod:`lightning_perf.output.loggers`.
"""

from __future__ import annotations

import csv
import logging
import os
from collections.abc import Mapping
from typing import Any

from lightning_perf.collect.namespaces import is_instance

log = logging.getLogger("lightning_perf")

FINDING_COLUMNS = ["severity", "title", "evidence", "recommendation"]
DIAGNOSIS_FILE = "perf_diagnosis.md"
FINDINGS_FILE = "perf_findings.csv"
# artifact paths inside an MLflow run
MLFLOW_DIR = "lightning_perf"


def findings_rows(summary: Any) -> list[list[str]]:
    return [[str(getattr(f, column)) for column in FINDING_COLUMNS] for f in summary.findings]


def settings_params(summary: Any) -> dict[str, Any]:
    """The settings fingerprint as flat ``perf/<name>`` hyperparameters (what TensorBoard's HParams tab shows);
    no CUDA version where the run used no CUDA (it is only the version torch was built with)."""
    params: dict[str, Any] = {}
    cuda = str(summary.settings.accelerator or "").lower() in ("cuda", "gpu")
    for name, value in vars(summary.settings).items():
        if name == "cuda_version" and not cuda:
            continue
        if value is not None:
            params[f"perf/{name}"] = value if isinstance(value, (bool, int, float, str)) else str(value)
    return params


def publish(
    logger: Any,
    summary: Any,
    metrics: Mapping[str, float],
    step: int,
    markdown: str | None,
    summary_path: str | None,
) -> None:
    """Everything a finished fit has, to one non-TensorBoard ``logger``; a failing logger only warns."""
    name = type(logger).__name__
    for label, send in (
        ("hyperparameters", lambda: logger.log_hyperparams(settings_params(summary))),
        ("summary metrics", lambda: metrics and logger.log_metrics(dict(metrics), step=step)),
        ("diagnosis", lambda: _publish_by_kind(logger, summary, metrics, markdown, summary_path)),
    ):
        try:
            send()
        except Exception as err:  # a logger failing must not stop the others, nor the run's end
            log.warning("lightning-perf: %s could not take the %s: %s", name, label, err)


def _publish_by_kind(
    logger: Any, summary: Any, metrics: Mapping[str, float], markdown: str | None, summary_path: str | None
) -> None:
    if is_instance(logger, "loggers", "MLFlowLogger"):
        _mlflow(logger, summary, markdown, summary_path)
    elif is_instance(logger, "loggers", "WandbLogger"):
        _wandb(logger, summary, metrics, summary_path)
    elif is_instance(logger, "loggers", "CSVLogger"):
        _csv(logger.log_dir, summary, markdown)


def _mlflow(logger: Any, summary: Any, markdown: str | None, summary_path: str | None) -> None:
    client, run_id = logger.experiment, logger.run_id
    if markdown:
        client.log_text(run_id, markdown, f"{MLFLOW_DIR}/{DIAGNOSIS_FILE}")
    if summary.findings:
        table = {"columns": FINDING_COLUMNS, "data": findings_rows(summary)}
        client.log_dict(run_id, table, f"{MLFLOW_DIR}/findings.json")
    if summary_path and os.path.isfile(summary_path):
        client.log_artifact(run_id, summary_path, MLFLOW_DIR)


def _wandb(logger: Any, summary: Any, metrics: Mapping[str, float], summary_path: str | None) -> None:
    run = logger.experiment
    if summary.findings:
        logger.log_table(key="perf/findings", columns=FINDING_COLUMNS, data=findings_rows(summary))
    run.summary.update(dict(metrics))
    if summary_path and os.path.isfile(summary_path):
        import wandb

        artifact = wandb.Artifact(f"perf_summary-{run.id}", type="perf_summary")
        artifact.add_file(summary_path)
        run.log_artifact(artifact)


def _csv(log_dir: str, summary: Any, markdown: str | None) -> None:
    os.makedirs(log_dir, exist_ok=True)
    if markdown:
        with open(os.path.join(log_dir, DIAGNOSIS_FILE), "w", encoding="utf-8") as fh:
            fh.write(markdown)
    if summary.findings:
        with open(os.path.join(log_dir, FINDINGS_FILE), "w", encoding="utf-8", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(FINDING_COLUMNS)
            writer.writerows(findings_rows(summary))
