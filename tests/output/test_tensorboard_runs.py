"""Two real runs side by side in a real TensorBoard: HParams, custom scalars, diagnosis text, comparison."""

import json

import pytest
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_perf import PerfCallback
from lightning_perf.cli import main as cli_main
from tests.helpers import TinyModel, loader, trainer
from tests.tensorboard_server import TensorBoardServer

STATUSES = ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"]


@pytest.fixture(scope="module")
def log_root(tmp_path_factory):
    """num_workers 0 and 2 over a DataLoader that sleeps 3 ms per sample; then `lightning-perf compare`."""
    root = tmp_path_factory.mktemp("runs")
    for workers in (0, 2):
        logger = TensorBoardLogger(str(root), name="exp", version=f"workers{workers}")
        callback = PerfCallback(skip_first=2, wait=1, warmup=1, active=2, probe_num_workers="never")
        trainer(root, [callback], logger=logger, limit_train_batches=24).fit(
            TinyModel(), loader(n=96, delay_s=0.003, num_workers=workers)
        )
    assert cli_main(["compare", str(root / "exp"), "--format", "json"]) == 0
    server = TensorBoardServer(str(root))
    try:
        yield server
    finally:
        server.close()


def hparams_request(server, route, **body):
    return server.get(f"/data/plugin/hparams/{route}", request=json.dumps(body))


def test_hparams_tab_lists_both_runs_with_settings_and_results(log_root):
    groups = log_root.wait_for(
        "/data/plugin/hparams/session_groups",
        lambda r: len(r.get("sessionGroups", [])) == 2,
        request=json.dumps({"startIndex": 0, "sliceSize": 10, "allowedStatuses": STATUSES, "colParams": []}),
    )["sessionGroups"]
    by_name = {g["name"]: g for g in groups}
    assert set(by_name) == {"exp/workers0", "exp/workers2"}
    for name, workers in (("exp/workers0", 0), ("exp/workers2", 2)):
        assert by_name[name]["hparams"]["perf/num_workers"] == workers
        metrics = {m["name"]["tag"]: m["value"] for m in by_name[name]["metricValues"]}
        assert metrics["perf_summary/step_time_median_ms"] > 0.0
        assert 0.0 <= metrics["perf_summary/data_wait_pct"] <= 100.0
        assert metrics["perf_summary/samples_per_sec"] > 0.0
    experiment = hparams_request(log_root, "experiment")
    assert "perf_summary/data_wait_pct" in [m["name"]["tag"] for m in experiment["metricInfos"]]


def test_custom_scalars_layout_groups_the_perf_charts(log_root):
    layout = log_root.wait_for("/data/plugin/custom_scalars/layout", lambda r: bool(r.get("category")))
    charts = {chart["title"] for category in layout["category"] for chart in category["chart"]}
    assert {
        "step time (ms)",
        "DataLoader wait (ms)",
        "DataLoader wait (% of step time)",
        "CPU (% of one core)",
    } <= charts


def test_diagnosis_and_comparison_texts_are_served(log_root):
    tags = log_root.wait_for(
        "/data/plugin/text/tags", lambda r: "exp/perf_compare" in r and "exp/workers0" in r
    )
    assert "perf_text/diagnosis" in " ".join(tags["exp/workers0"])
    (tag,) = tags["exp/perf_compare"]
    texts = log_root.get("/data/plugin/text/text", run="exp/perf_compare", tag=tag)
    content = texts[-1]["text"]
    assert "workers0" in content and "workers2" in content and "num_workers" in content
