"""The traces as torch-tb-profiler shows them, through a real `tensorboard` process and its HTTP API."""

import pytest

from lightning_perf import PerfCallback
from tests.helpers import TinyModel, loader, trainer
from tests.tensorboard_server import TensorBoardServer

PLUGIN = "/data/plugin/pytorch_profiler"
RUN = "lightning_logs/version_0"


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory):
    """A fit over a DataLoader that sleeps 10 ms per sample (40 ms per batch) and one trace of 3 steps.

    The wait is ~95% of a step, so a CPU hiccup of a few ms in one of the 3 traced steps on a busy machine
    cannot move the plugin's share far from the callback's run-wide figure (at 12 ms a batch it could)."""
    root = tmp_path_factory.mktemp("tb")
    callback = PerfCallback(
        skip_first=2, wait=1, warmup=1, active=3, repeat=1, utilization=False, diagnose=False
    )
    trainer(root, [callback], limit_train_batches=20).fit(TinyModel(), loader(n=80, delay_s=0.01))
    server = TensorBoardServer(str(root))
    try:
        yield server, callback.last_summary
    finally:
        server.close()


def overview(server):
    server.wait_for(f"{PLUGIN}/runs", lambda r: RUN in r["runs"] and not r["loading"])
    (worker,) = server.get(f"{PLUGIN}/workers", run=RUN, view="Overview")
    (span,) = server.get(f"{PLUGIN}/spans", run=RUN, worker=worker)
    return worker, server.get(f"{PLUGIN}/overview", run=RUN, worker=worker, span=span)


def test_plugin_lists_the_run_under_the_scalars_run_name_with_its_steps(profiled_run):
    server, _ = profiled_run
    worker, data = overview(server)
    assert worker.endswith("_rank0")
    steps = [row[0] for row in data["steps"]["rows"]]
    assert steps == ["4", "5", "6"]
    # the Scalars tab shows the same run name
    scalar_runs = server.wait_for("/data/plugin/scalars/tags", lambda r: RUN in r)
    assert "perf_step/time_ms" in scalar_runs[RUN]


def test_plugin_attributes_dataloader_time_like_the_callback_measured(profiled_run):
    server, summary = profiled_run
    _, data = overview(server)
    (average,) = data["performance"]
    parts = {child["name"]: child["extra"] for child in average["children"]}
    measured = summary.timing.data_wait_pct
    assert measured > 50.0
    # torch-tb-profiler would say 0 here without the trace rewrite (user_annotation spans are dropped). Its 3
    # profiled steps read 75-95% on a busy machine (a descheduled step's other work) against the run-wide 94-97%:
    # most of the step, never more than was measured
    assert 60.0 <= parts.get("DataLoader", 0.0) <= measured + 5.0
    assert "num_workers" in data["recommendations"]
