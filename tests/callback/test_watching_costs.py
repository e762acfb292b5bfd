"""What watching a fit costs it (issue 56): past the fit's first steps the hooks are timed on a sample of the
steps, and the anatomy counts exactly those; a probe the end of a fit runs is measured once per process, not again
by a later fit of the same loader. Real fits; no timing asserts."""

from __future__ import annotations

import time
from time import perf_counter

from lightning.pytorch.callbacks import Callback

from lightning_perf import PerfCallback
from lightning_perf.analysis.summary import RunSummary
from lightning_perf.collect.steps.hook_profiler import FULL_STEPS, SAMPLE_EVERY
from lightning_perf.probes import handoff
from tests.helpers import TinyModel, loader, trainer

STEPS = FULL_STEPS + 300


class TimedForward(TinyModel):
    """Each training_step sleeps 1 ms and times itself."""

    def __init__(self) -> None:
        super().__init__()
        self.forward_ms: list[float] = []

    def training_step(self, batch, batch_idx):
        started = perf_counter()
        time.sleep(0.001)
        self.forward_ms.append((perf_counter() - started) * 1e3)
        return super().training_step(batch, batch_idx)


class WhichTimed(Callback):
    """After PerfCallback: whether the hooks of each batch are timed (the stand-in for trainer.profiler says)."""

    def __init__(self) -> None:
        self.timed: list[bool] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.timed.append(trainer.profiler.timing)


def test_past_the_first_steps_the_hooks_are_timed_on_a_sample_and_the_anatomy_counts_exactly_those(tmp_path):
    perf, watch, model = PerfCallback(utilization=False, diagnose=False), WhichTimed(), TimedForward()
    trainer(tmp_path, [perf, watch], max_steps=STEPS, log_every_n_steps=50).fit(model, loader(n=4 * STEPS))
    summary = perf.last_summary
    timing, anatomy = summary.timing, summary.anatomy
    assert len(watch.timed) == STEPS and all(watch.timed[:FULL_STEPS])
    # the fit's first batch is the epoch's start-up, no step: the anatomy holds the other timed batches
    assert timing.steps == STEPS - 1
    assert anatomy.steps == sum(watch.timed[1:])
    # one in SAMPLE_EVERY of the later batches, at random (300 draws: 37.5 expected, 15-60 all but certain)
    assert 15 <= anatomy.steps - (FULL_STEPS - 1) <= 60, anatomy.steps
    assert anatomy.sample_every == SAMPLE_EVERY
    # the means are over all the steps: the sampled batches count SAMPLE_EVERY times each
    assert anatomy.step_ms == timing.step_time_ms.mean
    forward = sum(model.forward_ms[1:]) / timing.steps
    assert 0.8 * forward <= anatomy.parts_ms["forward"] <= forward + max(1.0, 0.25 * forward), (
        anatomy.parts_ms
    )


def test_a_short_fit_times_every_step(tmp_path):
    perf, watch = PerfCallback(enable_profiler=False, utilization=False, diagnose=False), WhichTimed()
    trainer(tmp_path, [perf, watch], max_steps=40).fit(TinyModel(), loader(n=4 * 40))
    anatomy = perf.last_summary.anatomy
    assert all(watch.timed) and anatomy.sample_every == 1
    assert anatomy.steps == perf.last_summary.timing.steps == 39


def input_bound_fit(tmp_path, data) -> RunSummary:
    # 8 ms of loading a batch beside a tiny step: input-bound, so the end of the fit measures a worker's hand-off
    perf = PerfCallback(
        enable_profiler=False, utilization=False, probe_num_workers="never", ab_cudnn_benchmark=False
    )
    trainer(tmp_path, [perf], max_steps=30).fit(TinyModel(), data)
    return perf.last_summary


def test_a_second_fit_of_the_same_loader_reuses_the_hand_off_the_first_measured(tmp_path, monkeypatch):
    measured = []
    real = handoff.measure_handoff

    def counted(dataloader, *args, **kwargs):
        measured.append(dataloader)
        return real(dataloader, *args, **kwargs)

    monkeypatch.setattr(handoff, "measure_handoff", counted)
    data = loader(n=4 * 30, delay_s=0.002)
    first, second = (input_bound_fit(tmp_path / name, data) for name in ("first", "second"))
    assert first.probes.handoff is not None and not first.probes.handoff.error, first.probes.handoff
    assert len(measured) == 1
    assert second.probes.handoff == first.probes.handoff
    # another loader of other batches is measured for itself
    third = input_bound_fit(tmp_path / "third", loader(n=4 * 30, batch_size=2, delay_s=0.004))
    assert len(measured) == 2 and third.probes.handoff.batch_bytes != first.probes.handoff.batch_bytes
