"""CSV, MLflow, W&B and no logger at all: each gets the run's end through its own API, in its own run dir."""

from __future__ import annotations

import csv
import glob
import json
import os

import pytest

from lightning_perf.analysis.summary import SUMMARY_FILENAME, RunSummary
from lightning_perf.output.loggers import NO_LOGGER_DIR
from tests.compat.namespace_fits import fit_trainer, pl, quick_callback, tiny_model  # noqa: F401
from tests.helpers import loader


def fit(pl, tmp_path, logger):  # noqa: F811
    callback = quick_callback()
    trainer = fit_trainer(pl, tmp_path, [callback], logger=logger)
    trainer.fit(tiny_model(pl), loader(n=48))
    return callback, trainer


def test_csv_logger_gets_metrics_hparams_diagnosis_and_the_files(pl, tmp_path):  # noqa: F811
    logger = pl.loggers.CSVLogger(str(tmp_path), name="csv")
    callback, _ = fit(pl, tmp_path, logger)
    run_dir = logger.log_dir
    saved = RunSummary.load(os.path.join(run_dir, SUMMARY_FILENAME))
    assert saved.log_dir == run_dir
    assert glob.glob(os.path.join(run_dir, "*.pt.trace.json*")), "traces beside the CSV logger's metrics"
    with open(os.path.join(run_dir, "metrics.csv")) as fh:
        columns = next(csv.reader(fh))
    assert "perf_step/time_ms" in columns and "perf_summary/step_time_median_ms" in columns
    with open(os.path.join(run_dir, "hparams.yaml")) as fh:
        assert "perf/accelerator: cpu" in fh.read()
    with open(os.path.join(run_dir, "perf_diagnosis.md")) as fh:
        assert "input-bound" in fh.read()
    with open(os.path.join(run_dir, "perf_findings.csv")) as fh:
        rows = list(csv.DictReader(fh))
    assert {row["title"] for row in rows} == {f.title for f in callback.last_summary.findings}


def test_no_logger_gets_a_new_version_dir_per_run(pl, tmp_path):  # noqa: F811
    first, _ = fit(pl, tmp_path, False)
    second, _ = fit(pl, tmp_path, False)
    assert NO_LOGGER_DIR == "lightning_perf_logs"  # not the package's name: it would shadow its import
    runs = sorted(os.listdir(tmp_path / NO_LOGGER_DIR))
    assert runs == ["version_0", "version_1"]
    for run, callback in zip(runs, (first, second), strict=True):
        run_dir = tmp_path / NO_LOGGER_DIR / run
        saved = RunSummary.load(run_dir / SUMMARY_FILENAME)
        assert saved.timing.steps == callback.last_summary.timing.steps
        assert glob.glob(str(run_dir / "*.pt.trace.json*"))
    loose = [name for name in os.listdir(tmp_path) if name != NO_LOGGER_DIR]
    assert loose == [], f"nothing loose in default_root_dir: {loose}"


def test_mlflow_logger_gets_metrics_params_text_table_and_the_summary_artifact(pl, tmp_path, monkeypatch):  # noqa: F811
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    # a file store: mlflow-skinny has no SQLAlchemy, so its sqlite store is not available here; MLflow 3
    # refuses file stores unless told (the same Lightning logger API serves either store)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    store = tmp_path / "mlruns"
    uri = f"file:{store}"
    logger = pl.loggers.MLFlowLogger(experiment_name="perf", tracking_uri=uri)
    callback, _ = fit(pl, tmp_path, logger)
    client = MlflowClient(uri)
    run = client.get_run(logger.run_id)
    assert "perf_summary/step_time_median_ms" in run.data.metrics
    assert "perf_step/time_ms" in run.data.metrics
    assert run.data.params["perf/accelerator"] == "cpu"
    artifacts = {a.path for a in client.list_artifacts(logger.run_id, "lightning_perf")}
    assert artifacts == {
        "lightning_perf/perf_diagnosis.md",
        "lightning_perf/findings.json",
        f"lightning_perf/{SUMMARY_FILENAME}",
    }
    local = client.download_artifacts(logger.run_id, "lightning_perf", str(tmp_path / "download"))
    with open(os.path.join(local, "findings.json")) as fh:
        table = json.load(fh)
    assert table["columns"][:2] == ["severity", "title"]
    assert len(table["data"]) == len(callback.last_summary.findings)
    assert RunSummary.load(os.path.join(local, SUMMARY_FILENAME)).timing.steps > 0
    # the run's files: save_dir/<experiment id>/<run id>, where Lightning puts an MLflow run's checkpoints
    run_dir = os.path.join(str(store), logger.experiment_id, logger.run_id)
    assert os.path.isfile(os.path.join(run_dir, SUMMARY_FILENAME))


def test_wandb_logger_offline_gets_summary_table_and_the_summary_artifact(pl, tmp_path, monkeypatch):  # noqa: F811
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = pl.loggers.WandbLogger(offline=True, save_dir=str(tmp_path), project="perf")
    try:
        callback, _ = fit(pl, tmp_path, logger)
        run = logger.experiment
        assert run.summary["perf_summary/step_time_median_ms"] > 0
        assert "perf/findings" in run.summary.keys()  # noqa: SIM118 - wandb.Summary has no __contains__
        run_dir = os.path.join(str(tmp_path), "perf", run.id)
        assert os.path.isfile(os.path.join(run_dir, SUMMARY_FILENAME))
    finally:
        logger.experiment.finish()
        wandb.teardown()  # the wandb-core service writes the run's record out when it stops
    # offline, the findings table is a file of the run, and the run's record (a protobuf log that
    # `wandb sync` uploads; wandb ships no Python reader for it any more) holds the summary artifact
    (offline_run,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*"))
    (table_file,) = glob.glob(os.path.join(offline_run, "files", "media", "table", "perf", "findings_*.json"))
    with open(table_file) as fh:
        table = json.load(fh)
    assert table["columns"] == ["severity", "title", "evidence", "recommendation"]
    assert [row[1] for row in table["data"]] == [f.title for f in callback.last_summary.findings]
    (record,) = glob.glob(os.path.join(offline_run, "run-*.wandb"))
    with open(record, "rb") as fh:
        assert f"perf_summary-{run.id}".encode() in fh.read()
