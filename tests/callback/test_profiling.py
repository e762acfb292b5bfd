"""PerfCallback drives torch.profiler on batch boundaries: real Trainer.fit runs on a tiny model."""

import copy
import logging
import os
import pickle
import re
import socket

import lightning as L
import pytest
import torch

from lightning_perf import PerfCallback
from lightning_perf.collect.profiling.profiler_window import profiler_enabled, worker_name
from tests.helpers import (
    SleepyIterable,
    TinyModel,
    TwoOptimizerModel,
    events_inside,
    load_trace,
    loader,
    step_spans,
    trace_files,
    trainer,
)

SCHEDULE = dict(skip_first=2, wait=1, warmup=1, active=2, repeat=2)
QUIET = dict(utilization=False, diagnose=False)


def names_in(trace, span):
    return {e["name"] for e in events_inside(trace, span)}


def test_two_cycles_over_30_batches_give_two_traces_of_two_whole_steps(tmp_path):
    callback = PerfCallback(**SCHEDULE, **QUIET)
    trainer(tmp_path, [callback], max_epochs=2, limit_train_batches=15).fit(TinyModel(), loader(n=60))

    files = trace_files(tmp_path)
    assert len(files) == 2
    host_rank = worker_name(0, socket.gethostname())
    step_numbers = []
    for path in files:
        assert re.fullmatch(re.escape(host_rank) + r"\.\d+\.pt\.trace\.json\.gz", os.path.basename(path))
        assert os.path.dirname(path) == os.path.join(str(tmp_path), "lightning_logs", "version_0")
        trace = load_trace(path)
        spans = step_spans(trace)
        assert len(spans) == 2
        for span in spans:
            inside = names_in(trace, span)
            # the whole batch: its DataLoader fetch, forward, backward and the optimizer step
            assert any(n.startswith("enumerate(DataLoader)#") for n in inside), inside
            assert any("aten::addmm" in n or "aten::linear" in n for n in inside)
            assert any("autograd::engine::evaluate_function" in n or "Backward" in n for n in inside)
            assert any(n.startswith("Optimizer.step#SGD.step") for n in inside)
            step_numbers.append(int(span["name"].split("#")[1]))
    # ProfilerStep numbers are the batch indices of the schedule: active batches 4-5 and 8-9
    assert sorted(step_numbers) == [4, 5, 8, 9]
    assert [t.steps for t in callback.last_summary.traces] == [[4, 5], [8, 9]]
    assert not profiler_enabled()


def test_repeat_zero_profiles_until_training_ends(tmp_path):
    callback = PerfCallback(skip_first=0, wait=1, warmup=1, active=1, repeat=0, **QUIET)
    trainer(tmp_path, [callback], limit_train_batches=12).fit(TinyModel(), loader())
    assert len(trace_files(tmp_path)) == 4  # batches 2, 5, 8, 11


def test_gradient_accumulation_keeps_one_span_per_batch(tmp_path):
    callback = PerfCallback(skip_first=0, wait=0, warmup=1, active=4, repeat=1, **QUIET)
    trainer(tmp_path, [callback], limit_train_batches=8, accumulate_grad_batches=2).fit(TinyModel(), loader())
    (path,) = trace_files(tmp_path)
    trace = load_trace(path)
    spans = step_spans(trace)
    assert [s["name"] for s in spans] == [
        "ProfilerStep#1",
        "ProfilerStep#2",
        "ProfilerStep#3",
        "ProfilerStep#4",
    ]
    stepped = [any(n.startswith("Optimizer.step#") for n in names_in(trace, s)) for s in spans]
    # batches 1 and 3 (0-based) complete an accumulation of two: the optimizer steps there only
    assert stepped == [True, False, True, False]
    assert all(any(n.startswith("enumerate(DataLoader)#") for n in names_in(trace, s)) for s in spans)


def test_manual_optimization_with_two_optimizers_stays_in_one_span(tmp_path):
    callback = PerfCallback(skip_first=1, wait=0, warmup=1, active=2, repeat=1, **QUIET)
    trainer(tmp_path, [callback], limit_train_batches=6).fit(TwoOptimizerModel(), loader())
    (path,) = trace_files(tmp_path)
    trace = load_trace(path)
    spans = step_spans(trace)
    assert len(spans) == 2
    for span in spans:
        inside = names_in(trace, span)
        assert any(n.startswith("Optimizer.step#SGD.step") for n in inside)
        assert any(n.startswith("Optimizer.step#Adam.step") for n in inside)


def test_iterable_dataset_is_profiled_per_batch(tmp_path):
    callback = PerfCallback(skip_first=1, wait=0, warmup=1, active=3, repeat=1, **QUIET)
    data = torch.utils.data.DataLoader(SleepyIterable(n=40), batch_size=4)
    trainer(tmp_path, [callback], max_epochs=1).fit(TinyModel(), data)
    (path,) = trace_files(tmp_path)
    assert len(step_spans(load_trace(path))) == 3


def test_exception_inside_an_active_window_saves_the_recorded_steps(tmp_path):
    callback = PerfCallback(skip_first=0, wait=0, warmup=1, active=10, repeat=1, **QUIET)
    model = TinyModel(fail_at_batch=4)  # batches 1-3 are recorded, batch 4 raises
    with pytest.raises(RuntimeError, match="injected failure"):
        trainer(tmp_path, [callback], limit_train_batches=12).fit(model, loader())
    assert not profiler_enabled()
    (path,) = trace_files(tmp_path)
    assert len(step_spans(load_trace(path))) >= 3
    assert callback.last_summary.status == "failed"


def test_keyboard_interrupt_leaves_no_profiler_and_keeps_the_trace(tmp_path):
    callback = PerfCallback(skip_first=0, wait=0, warmup=1, active=10, repeat=1, **QUIET)
    model = TinyModel(fail_at_batch=4, interrupt=True)
    with pytest.raises(SystemExit):  # Lightning turns Ctrl+C into a graceful shutdown and exit(1)
        trainer(tmp_path, [callback], limit_train_batches=12).fit(model, loader())
    assert not profiler_enabled()
    assert len(trace_files(tmp_path)) == 1
    assert callback.last_summary.status == "interrupted"


def test_run_shorter_than_the_schedule_writes_no_trace_and_says_so(tmp_path, caplog):
    callback = PerfCallback(skip_first=5, wait=1, warmup=1, active=3, **QUIET)
    with caplog.at_level(logging.INFO):
        trainer(tmp_path, [callback], limit_train_batches=4).fit(TinyModel(), loader())
    assert trace_files(tmp_path) == []
    assert "shorter than the profiling schedule" in caplog.text
    assert not profiler_enabled()


def test_fast_dev_run_works(tmp_path):
    callback = PerfCallback(skip_first=0, wait=0, warmup=1, active=1, **QUIET)
    L_trainer = trainer(tmp_path, [callback], fast_dev_run=3)
    L_trainer.fit(TinyModel(), loader())
    assert L_trainer.state.finished
    assert not profiler_enabled()


def test_validation_inside_a_window_does_not_advance_the_schedule(tmp_path):
    # validation every 3 batches falls inside the recorded window (batches 2-5)
    callback = PerfCallback(skip_first=0, wait=1, warmup=1, active=4, repeat=1, **QUIET)
    trainer(
        tmp_path,
        [callback],
        limit_train_batches=10,
        val_check_interval=3,
        limit_val_batches=3,
        num_sanity_val_steps=2,
    ).fit(TinyModel(), loader(), loader(n=12))
    (path,) = trace_files(tmp_path)
    trace = load_trace(path)
    spans = step_spans(trace)
    assert [s["name"] for s in spans] == [f"ProfilerStep#{i}" for i in range(2, 6)]
    for span in spans:  # no validation batch was counted inside a training step
        assert not any("validation_step" in n for n in names_in(trace, span))


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_inference_calls_are_profiled_with_the_same_schedule(tmp_path, stage):
    callback = PerfCallback(skip_first=1, wait=0, warmup=1, active=2, repeat=1, **QUIET)
    L_trainer = trainer(tmp_path, [callback])
    getattr(L_trainer, stage)(TinyModel(), loader(n=40))
    (path,) = trace_files(tmp_path)
    spans = step_spans(load_trace(path))
    assert [s["name"] for s in spans] == ["ProfilerStep#2", "ProfilerStep#3"]
    assert callback.last_summary.stage == stage
    assert not profiler_enabled()


def test_one_instance_behaves_the_same_for_two_fits_and_pickles(tmp_path):
    callback = PerfCallback(skip_first=1, wait=0, warmup=1, active=2, repeat=1, **QUIET)
    for run in ("a", "b"):
        trainer(tmp_path / run, [callback], limit_train_batches=6).fit(TinyModel(), loader())
        assert len(trace_files(tmp_path / run)) == 1
        clone = pickle.loads(pickle.dumps(callback))
        assert clone.config == callback.config
        assert copy.deepcopy(callback).config == callback.config
    assert len(callback.last_summary.traces) == 1


def test_dirpath_overrides_the_log_dir(tmp_path):
    callback = PerfCallback(
        skip_first=0, wait=0, warmup=1, active=1, dirpath=str(tmp_path / "traces"), **QUIET
    )
    trainer(tmp_path / "logs", [callback], limit_train_batches=4).fit(TinyModel(), loader())
    assert len(trace_files(tmp_path / "traces")) == 1
    assert os.path.exists(tmp_path / "traces" / "perf_summary.json")


def test_unwritable_trace_dir_warns_and_training_goes_on(tmp_path, caplog):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    callback = PerfCallback(
        skip_first=0, wait=0, warmup=1, active=1, repeat=2, dirpath=str(blocker / "x"), **QUIET
    )
    L_trainer = trainer(tmp_path, [callback], limit_train_batches=6)
    with caplog.at_level(logging.WARNING, logger="lightning_perf"):
        L_trainer.fit(TinyModel(), loader())
    assert any("could not write the trace" in r.getMessage() for r in caplog.records)
    assert L_trainer.state.finished
    assert not profiler_enabled()


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (dict(skip_first=-1), "skip_first"),
        (dict(active=0), "active"),
        (dict(activities=["cpu", "tpu"]), "activities"),
        (dict(activities=[]), "activities"),
        (dict(max_trace_mb=0), "max_trace_mb"),
        (dict(batch_size=0), "batch_size"),
        (dict(util_interval_s=-1), "util_interval_s"),
        (dict(probe_num_workers="sometimes"), "probe_num_workers"),
        (dict(log_every_n_steps=0), "log_every_n_steps"),
    ],
)
def test_bad_configuration_names_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        PerfCallback(**kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_activity_without_cuda_is_rejected():
    with pytest.raises(ValueError, match="`activities`.*no CUDA device"):
        PerfCallback(activities=["cpu", "cuda"])


def test_trainer_with_a_pytorch_profiler_fails_before_any_batch(tmp_path):
    model = TinyModel()
    with pytest.raises(ValueError, match="PyTorchProfiler"):
        trainer(tmp_path, [PerfCallback(**QUIET)], profiler="pytorch", limit_train_batches=4).fit(
            model, loader()
        )
    assert model.seen_batches == 0
    assert not profiler_enabled()


def test_lightning_simple_and_advanced_profilers_coexist(tmp_path):
    for profiler in ("simple", "advanced"):
        callback = PerfCallback(skip_first=0, wait=0, warmup=1, active=2, **QUIET)
        run = tmp_path / profiler
        L.seed_everything(0)
        trainer(run, [callback], profiler=profiler, limit_train_batches=6).fit(TinyModel(), loader())
        assert len(trace_files(run)) == 1
        assert callback.last_summary.timing.steps == 5
