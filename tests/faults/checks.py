"""What every fault case checks after the fault: nothing left on, nothing half-written, nothing lost."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import lightning as L
import pytest
import torch

from lightning_perf import PerfCallback
from lightning_perf.analysis.summary import SUMMARY_FILENAME, RunSummary
from lightning_perf.atomic_file import TEMP_SUFFIX
from lightning_perf.collect.profiling.profiler_window import profiler_enabled
from lightning_perf.traces.read.reader import read_metadata
from tests.helpers import TinyModel, loader, trainer

SAMPLER_THREAD = "lightning_perf-util-sampler"
# skip 1, wait 1, warm up 1, record 2: batches 3 and 4 are recorded, the trace is saved at batch 5's start
CYCLE = dict(skip_first=1, wait=1, warmup=1, active=2, repeat=1)
QUIET = dict(diagnose=False, log_hparams=False)
BATCHES = 8
# the first batch of an epoch is timed apart (iterator creation, worker start-up), not as a step
TIMED_STEPS = BATCHES - 1


def files_under(directory: str) -> Iterator[str]:
    for root, _, names in os.walk(directory):
        for name in names:
            yield os.path.join(root, name)


def assert_nothing_left_on() -> None:
    assert not profiler_enabled(), "a torch profiler is left on"
    alive = [t.name for t in threading.enumerate() if t.name == SAMPLER_THREAD]
    assert not alive, f"sampler thread left running: {alive}"


def assert_no_partial_files(directory: str) -> list[str]:
    """No temporaries left, and every file under a final name is whole. Returns the trace files."""
    traces = []
    for path in files_under(directory):
        name = os.path.basename(path)
        assert TEMP_SUFFIX not in name and ".raw.json" not in name, f"temporary left behind: {path}"
        if name.endswith(".pt.trace.json.gz"):
            read_metadata(path)  # raises TraceError for a cut or corrupt file
            traces.append(path)
        elif name.startswith("perf_summary") and name.endswith(".json"):
            RunSummary.load(path)
    return traces


def assert_recorded_kept(directory: str, callback: PerfCallback) -> RunSummary | None:
    """The summary on disk (if any) lists exactly the traces on disk, and agrees with the callback's."""
    path = os.path.join(directory, SUMMARY_FILENAME)
    if not os.path.exists(path):
        return None
    summary = RunSummary.load(path)
    on_disk = {os.path.basename(p) for p in files_under(directory) if p.endswith(".pt.trace.json.gz")}
    assert {t.path for t in summary.traces} == on_disk
    if callback.last_summary is not None:
        assert summary.timing.steps == callback.last_summary.timing.steps
    return summary


def check_all(directory: str, callback: PerfCallback) -> RunSummary | None:
    assert_nothing_left_on()
    assert_no_partial_files(directory)
    return assert_recorded_kept(directory, callback)


def weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def seeded_fit(tmp_path, callbacks, model_cls=TinyModel, **trainer_kwargs) -> tuple[L.Trainer, TinyModel]:
    """A deterministic fit (same seed, no shuffling, no workers): equal weights mean an unchanged result."""
    torch.manual_seed(0)
    model = model_cls()
    data = loader(n=BATCHES * 4)
    trainer_kwargs.setdefault("limit_train_batches", BATCHES)
    fit_trainer = trainer(tmp_path, callbacks, **trainer_kwargs)
    fit_trainer.fit(model, data)
    return fit_trainer, model


@pytest.fixture
def restore_sigint():
    """Ctrl-C as a user's process has it (KeyboardInterrupt), whatever an earlier test left; Lightning answers
    Ctrl-C by ignoring SIGINT for the rest of the process: given back after."""
    handler = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, handler)
