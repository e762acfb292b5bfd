"""During a fit PerfCallback times every hook through a stand-in for ``trainer.profiler``; to the user's code and to
the user's profiler it behaves as the user's own profiler does (issue 54): the user's ``profile()`` gets
Lightning's calls, ``with ... as`` binds what it binds, ``isinstance`` holds, and a ``start()`` the user's code
never stops is as harmless as it is without PerfCallback. Real fits."""

from __future__ import annotations

import time
from contextlib import contextmanager
from time import perf_counter

from lightning.pytorch.profilers import PassThroughProfiler, Profiler, SimpleProfiler

from lightning_perf import PerfCallback
from tests.helpers import TinyModel, loader, trainer

BATCHES = 24
TRAINING_STEP = "[Strategy]SingleDeviceStrategy.training_step"


class RecordingProfiler(Profiler):
    """A profiler of the user's that overrides ``profile()``: it records each action's name, and binds its own
    value to ``with ... as``."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[str] = []
        self.starts: list[str] = []

    def start(self, action_name: str) -> None:
        self.starts.append(action_name)

    def stop(self, action_name: str) -> None:
        pass

    @contextmanager
    def profile(self, action_name: str):
        self.records.append(action_name)
        yield f"recorded {action_name}"


class AskingModel(TinyModel):
    """In every training_step: what ``trainer.profiler`` is an instance of, and what ``with profile("x") as``
    binds."""

    def __init__(self, profiler_class: type) -> None:
        super().__init__()
        self.profiler_class = profiler_class
        self.instances: list[bool] = []
        self.bound: list[object] = []
        self.profiler_types: set[type] = set()

    def training_step(self, batch, batch_idx):
        profiler = self.trainer.profiler
        self.profiler_types.add(type(profiler))
        self.instances.append(isinstance(profiler, self.profiler_class))
        with profiler.profile("x") as got:
            self.bound.append(got)
        return super().training_step(batch, batch_idx)


def fit(tmp_path, model, profiler=None, perf=True, batches=BATCHES):
    callbacks = (
        [PerfCallback(probe_num_workers="never", enable_profiler=False, utilization=False)] if perf else []
    )
    trainer(tmp_path, callbacks, profiler=profiler).fit(model, loader(n=4 * batches))
    return callbacks[0].last_summary if perf else None


def test_a_profilers_own_profile_gets_lightnings_calls_and_binds_its_value(tmp_path):
    profiler = RecordingProfiler()
    model = AskingModel(RecordingProfiler)
    summary = fit(tmp_path, model, profiler)
    assert (
        summary.anatomy is not None and summary.anatomy.parts_ms["forward"] > 0
    )  # the stand-in timed the hooks
    assert RecordingProfiler not in model.profiler_types  # isinstance was asked of the stand-in
    # Lightning's `with trainer.profiler.profile(name)` reached the user's profile(), every hook of every batch
    assert profiler.records.count("run_training_batch") == BATCHES
    assert profiler.records.count(TRAINING_STEP) == BATCHES
    assert profiler.records.count("x") == BATCHES
    # its start() gets Lightning's start/stop pairs (the fetch), as without PerfCallback; no name of ours
    assert any(name.endswith("train_dataloader_next") for name in profiler.starts)
    assert not any(name.startswith("[Logger]") for name in profiler.records + profiler.starts)
    assert model.bound == ["recorded x"] * BATCHES
    assert model.instances == [True] * BATCHES


def test_with_the_default_profiler_the_stand_in_is_a_pass_through_profiler_that_binds_the_name(tmp_path):
    model = AskingModel(PassThroughProfiler)
    summary = fit(tmp_path, model)
    assert model.instances == [True] * BATCHES
    assert model.bound == ["x"] * BATCHES  # what Lightning's Profiler.profile yields: the action's name
    assert summary.anatomy is not None and summary.anatomy.parts_ms["forward"] > 0
    assert isinstance(model.trainer.profiler, PassThroughProfiler)  # the user's again after the fit
    assert type(model.trainer.profiler) is PassThroughProfiler


class UnpairedStart(TinyModel):
    """Starts a profiler action it never stops, on the batches in ``at`` (harmless without PerfCallback); every
    training_step sleeps 3 ms, timed by the model."""

    def __init__(self, at: range) -> None:
        super().__init__()
        self.at = at
        self.forward_ms: list[float] = []
        self.depths: list[int] = []  # the stand-in's open entries, seen from training_step

    def training_step(self, batch, batch_idx):
        started = perf_counter()
        if batch_idx in self.at:
            self.trainer.profiler.start("left open")
        time.sleep(0.003)
        self.forward_ms.append((perf_counter() - started) * 1e3)
        self.depths.append(len(getattr(self.trainer.profiler, "_stack", ())))
        return super().training_step(batch, batch_idx)


def test_a_start_left_open_in_training_step_fails_no_batch_of_a_simple_profiler(tmp_path):
    # without PerfCallback: SimpleProfiler keeps "left open" open and records every hook of every batch
    alone = SimpleProfiler()
    fit(tmp_path / "alone", UnpairedStart(range(3, 4)), alone, perf=False)
    ours = SimpleProfiler()
    model = UnpairedStart(range(3, 4))
    summary = fit(tmp_path / "perf", model, ours)  # raised "already started" on the next batch before
    assert len(ours.recorded_durations[TRAINING_STEP]) == BATCHES
    # every action Lightning timed, as often as without PerfCallback (less PerfCallback's own hooks)
    counts = {n: len(times) for n, times in ours.recorded_durations.items() if "PerfCallback" not in n}
    assert counts == {name: len(times) for name, times in alone.recorded_durations.items()}
    assert list(ours.current_actions) == list(alone.current_actions) == ["left open"]
    assert summary.anatomy.steps == summary.timing.steps == BATCHES - 1


def test_a_start_left_open_every_batch_leaves_the_anatomy_as_it_was(tmp_path):
    model = UnpairedStart(range(BATCHES))
    summary = fit(tmp_path, model)
    # a start left open ends with the hook around it: training_step sees as many open entries at the last batch as
    # at the second, not one more a batch
    assert model.depths[1] > 0 and model.depths[-1] == model.depths[1], model.depths
    # each hook's `with` closed its own entry: training_step's time is the forward part, not another hook's
    anatomy, steps = summary.anatomy, summary.timing.steps
    timed = sum(model.forward_ms[1:]) / steps
    forward = anatomy.parts_ms["forward"]
    assert timed <= forward <= timed + max(1.0, 0.25 * timed), (timed, anatomy.parts_ms)
    assert anatomy.parts_ms["loop"] > 0.0
    assert anatomy.steps == steps == BATCHES - 1


def test_the_user_profilers_errors_stay_its_own(tmp_path):
    # a start() never stopped, twice: SimpleProfiler raises on the second, with PerfCallback as without it
    errors = []
    for perf in (False, True):
        model = UnpairedStart(range(2, BATCHES))
        try:
            fit(tmp_path / str(perf), model, SimpleProfiler(), perf=perf)
        except ValueError as err:
            errors.append((str(err), len(model.forward_ms)))
    assert errors[0] == errors[1] == ("Attempted to start left open which has already started.", 3)
