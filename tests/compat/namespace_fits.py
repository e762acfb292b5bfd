"""Real fits under either Lightning namespace: ``lightning.pytorch`` or the standalone ``pytorch_lightning``."""

from __future__ import annotations

import importlib
from functools import cache

import pytest

from lightning_perf import PerfCallback
from tests.helpers import TinyModelSteps, trainer

NAMESPACES = ["lightning.pytorch", "pytorch_lightning"]


@pytest.fixture(params=NAMESPACES)
def pl(request):
    """The Lightning namespace a test runs under, imported as users do (``import pytorch_lightning as pl``)."""
    return pytest.importorskip(request.param)


@cache
def tiny_model_class(namespace: str) -> type:
    module = importlib.import_module(namespace)
    return type("TinyModel", (TinyModelSteps, module.LightningModule), {})


def tiny_model(pl, **kwargs):
    return tiny_model_class(pl.__name__)(**kwargs)


def quick_callback(**kwargs) -> PerfCallback:
    options = dict(skip_first=1, wait=1, warmup=1, active=2, probe_num_workers="never", log_min_interval_s=0)
    options.update(kwargs)
    return PerfCallback(**options)


def fit_trainer(pl, tmp_path, callbacks, **kwargs):
    options = dict(limit_train_batches=12, log_every_n_steps=4)
    options.update(kwargs)
    return trainer(tmp_path, callbacks, pl=pl, **options)
