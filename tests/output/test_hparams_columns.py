"""The HParams tab's default columns are what tells the runs apart: two real runs that differ only in
``prefetch_factor`` and the user's ``lr``, read back through a real TensorBoard."""

from __future__ import annotations

import json

import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_perf import PerfCallback
from lightning_perf.output.hparams_tab import SHOWN_COLUMNS, default_columns
from tests.helpers import TinyModel, loader, trainer
from tests.tensorboard_server import TensorBoardServer


class ModelWithLr(TinyModel):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.save_hyperparameters()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for prefetch, lr in ((2, 0.01), (4, 0.02)):
        callback = PerfCallback(enable_profiler=False, probe_num_workers="never", diagnose=False)
        trainer(root, [callback], logger=TensorBoardLogger(str(root)), limit_train_batches=8).fit(
            ModelWithLr(lr), loader(n=32, num_workers=1, prefetch_factor=prefetch)
        )
    served = TensorBoardServer(str(root))
    try:
        yield served
    finally:
        served.close()


def shown_by_tensorboard(experiment: dict) -> list[str]:
    """The columns TensorBoard's HParams tab shows by default: the backend's order (``differs`` first, then by
    name), the first five."""
    infos = experiment["hparamInfos"]
    return [i["name"] for i in sorted(infos, key=lambda i: (not i.get("differs", False), i["name"]))][:5]


def test_the_default_columns_are_what_differs_then_the_speed_settings(server):
    experiment = server.wait_for(
        "/data/plugin/hparams/experiment",
        lambda r: len(r.get("hparamInfos", [])) > 0,
        request=json.dumps({"experimentName": ""}),
    )
    shown = shown_by_tensorboard(experiment)
    assert {"perf/prefetch_factor", "lr"} <= set(shown)
    assert {"perf/num_workers", "perf/precision", "perf/batch_size"} <= set(shown)  # then the speed settings
    names = {i["name"]: i for i in experiment["hparamInfos"]}
    assert names["perf/prefetch_factor"]["displayName"] == "prefetch_factor"
    metrics = {m["name"]["tag"]: m for m in experiment["metricInfos"]}
    assert metrics["perf_summary/step_time_mean_ms"]["displayName"] == "mean step time (ms)"


def test_one_experiment_file_in_the_folder_of_the_runs(server):
    import glob
    import os

    root = server.logdir
    assert len(glob.glob(os.path.join(root, "lightning_logs", "events.out.tfevents.*"))) == 1
    assert len(glob.glob(os.path.join(root, "lightning_logs", "version_*", "perf_hparams.json"))) == 2


def test_default_columns_alone():
    same = {"perf/num_workers": 2, "perf/precision": "32-true", "perf/batch_size": 4, "lr": 0.1}
    # one run, or runs alike: the speed settings
    assert default_columns([same]) == {"perf/num_workers", "perf/precision", "perf/batch_size"}
    # what differs (a value, or a key one run lacks) first; the speed settings fill the rest of the five
    other = {**same, "lr": 0.2, "extra": 1}
    assert default_columns([same, other]) == {
        "lr",
        "extra",
        "perf/num_workers",
        "perf/precision",
        "perf/batch_size",
    }
    many = {f"h{i}": i for i in range(7)}
    assert default_columns([{}, many]) == set(many)  # more than five differ: those, no speed setting
    assert SHOWN_COLUMNS == 5


def test_a_fifo_or_a_deeply_nested_values_file_of_another_run_neither_hangs_nor_fails_the_end_of_a_fit(
    tmp_path,
):
    """The end of a fit reads every sibling run's ``perf_hparams.json``: one that is a FIFO blocked it (an open
    waits for a writer) and one nested 100,000 deep raised RecursionError out of ``fit``."""
    import os
    import threading

    from lightning_perf.output.hparams_experiment import VALUES_FILENAME, runs_values

    root = tmp_path / "lightning_logs"
    for name in ("version_90", "version_91"):
        (root / name).mkdir(parents=True)
    os.mkfifo(root / "version_90" / VALUES_FILENAME)
    (root / "version_91" / VALUES_FILENAME).write_text("[" * 100_000 + "]" * 100_000)
    done: list[object] = []

    def fit() -> None:
        callback = PerfCallback(enable_profiler=False, probe_num_workers="never", diagnose=False)
        trainer(tmp_path, [callback], logger=TensorBoardLogger(str(tmp_path)), limit_train_batches=4).fit(
            ModelWithLr(0.01), loader(n=16)
        )
        done.append(runs_values(str(root)))

    thread = threading.Thread(target=fit, daemon=True)
    thread.start()
    thread.join(120)  # a guard against the hang only: a fit of 4 batches takes seconds
    assert not thread.is_alive(), "the end of the fit hung on the FIFO"
    assert done and len(done[0]) == 1  # the fit's own values, the two bad files skipped
