"""A log root of real runs for the Perf tab's tests, made once a session: two tiny fits over a sleeping
DataLoader (num_workers 0, with the num_workers probe, and num_workers 2) and a two-process DDP fit whose
rank 1 loads slower (the straggler), each with PerfCallback and one profiled cycle; and the two fits' comparison
saved as a trial saves it (``exp/comparison.json``)."""

from __future__ import annotations

import contextlib
import io

import pytest
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.data import DataLoader

from lightning_perf import PerfCallback
from lightning_perf.cli import main as cli_main
from tests.ddp_models import RankSlowedDataset
from tests.helpers import TinyModel, loader, trainer
from tests.tensorboard_server import TensorBoardServer

PROFILE = dict(skip_first=2, wait=1, warmup=1, active=2, log_min_interval_s=0)


def fit_workers(root, workers: int) -> None:
    callback = PerfCallback(
        **PROFILE, probe_num_workers="always" if workers == 0 else "never", probe_budget_s=2.0
    )
    logger = TensorBoardLogger(str(root), name="exp", version=f"workers{workers}")
    trainer(root, [callback], logger=logger, limit_train_batches=24).fit(
        TinyModel(), loader(n=96, delay_s=0.003, num_workers=workers)
    )


def fit_ddp(root) -> None:
    # 16 batches a rank: well above the 10 timed steps an input-bound verdict needs (MIN_STEPS_FOR_VERDICT)
    callback = PerfCallback(**PROFILE, probe_num_workers="never")
    logger = TensorBoardLogger(str(root), name="exp", version="ddp2")
    data = DataLoader(RankSlowedDataset(n=128, slow_rank=1, delay_s=0.002), batch_size=4)
    trainer(
        root,
        [callback],
        logger=logger,
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        log_every_n_steps=4,
    ).fit(TinyModel(), data)


@pytest.fixture(scope="session")
def perf_runs(tmp_path_factory):
    """The log root: exp/workers0, exp/workers2, exp/ddp2."""
    root = tmp_path_factory.mktemp("perf_tab")
    fit_workers(root, 0)
    fit_workers(root, 2)
    fit_ddp(root)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        runs = [str(root / "exp" / "workers0"), str(root / "exp" / "workers2")]
        assert cli_main(["compare", *runs, "--format", "json", "--no-tensorboard"]) == 0
    (root / "exp" / "comparison.json").write_text(printed.getvalue())
    return root


@pytest.fixture(scope="module")
def perf_server(perf_runs):
    """A real ``tensorboard`` on the log root, once the Perf tab is listed; stopped after the module."""
    server = TensorBoardServer(str(perf_runs))
    try:
        server.wait_for("/data/plugins_listing", lambda r: r.get("lightning_perf", {}).get("enabled"))
        yield server
    finally:
        server.close()
