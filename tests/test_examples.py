"""The examples run end to end in their smoke modes: real Trainer runs, real TensorBoard files, the real CLI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import lightning
import pytest
import torch
from lightning.pytorch.cli import LightningCLI
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

# the examples need the `examples` extra (torchvision); the library does not
pytest.importorskip("torchvision")

from examples import cnn_inference, resnet18_cifar10  # noqa: E402
from examples.resnet18_cifar10 import (  # noqa: E402
    CIFAR10DataModule,
    ResNet18Classifier,
    auto_num_workers,
)
from lightning_perf import PerfCallback  # noqa: E402
from lightning_perf.analysis.summary import SUMMARY_FILENAME, RunSummary  # noqa: E402
from tests.helpers import trace_files  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "config.yaml"
# the case study's and the config's schedule: skip 1, then 2 cycles of 1 idle + 1 warm-up + 3 recorded
RECORDED_STEPS = [[3, 4, 5], [8, 9, 10]]


# ---------------------------------------------------------------------------------- resnet18_cifar10 study


def test_case_study_smoke_prints_before_after_table_and_writes_both_runs(tmp_path, capsys):
    benchmark_was = torch.backends.cudnn.benchmark

    assert resnet18_cifar10.main(["--smoke", "--log-dir", str(tmp_path)]) == 0

    out = capsys.readouterr().out
    runs = tmp_path / "resnet18_cifar10"
    assert re.search(r"^ +before \(baseline\) +after$", out, re.MULTILINE), out
    for row in ("num_workers", "cudnn_benchmark", "median step time", "data wait", "throughput", "verdict:"):
        assert row in out, row
    assert f"tensorboard --logdir {runs}" in out
    before = RunSummary.load(runs / "before" / SUMMARY_FILENAME)
    after = RunSummary.load(runs / "after" / SUMMARY_FILENAME)
    assert (before.settings.num_workers, after.settings.num_workers) == (0, auto_num_workers())
    assert (before.settings.cudnn_benchmark, after.settings.cudnn_benchmark) == (False, True)
    for summary, name in ((before, "before"), (after, "after")):
        assert summary.status == "finished"
        assert summary.settings.batch_size == resnet18_cifar10.SMOKE_BATCH_SIZE
        assert summary.timing.steps > 0 and summary.timing.data_wait_pct is not None
        assert [t.steps for t in summary.traces] == RECORDED_STEPS
        assert len(trace_files(runs / name)) == 2
    # Trainer(benchmark=True) set it process-wide; the study puts it back
    assert torch.backends.cudnn.benchmark == benchmark_was


def test_case_study_rerun_replaces_the_previous_runs(tmp_path, capsys):
    stale = tmp_path / "resnet18_cifar10" / "before" / "stale.pt.trace.json.gz"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"old")

    resnet18_cifar10.main(["--smoke", "--steps", "2", "--log-dir", str(tmp_path)])

    assert not stale.exists()
    assert "replacing the previous run" in capsys.readouterr().out
    assert RunSummary.load(stale.parent / SUMMARY_FILENAME).timing.steps > 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--steps", "0"], "--steps must be >= 1, got 0"),
        (["--batch-size", "-1"], "--batch-size must be >= 1, got -1"),
        (["--workers", "0"], "--workers must be >= 1, got 0"),
        (["--data", "imagenet"], "invalid choice: 'imagenet'"),
    ],
)
def test_case_study_rejects_bad_flags_naming_them(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        resnet18_cifar10.parse_study_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_auto_num_workers_is_one_per_usable_core_up_to_the_cap():
    expected = min(resnet18_cifar10.MAX_AUTO_WORKERS, len(os.sched_getaffinity(0)))
    assert auto_num_workers() == expected


def test_resnet_stems_give_ten_logits_for_cifar_shaped_images():
    images = torch.zeros(2, 3, 32, 32)
    plain, cifar = ResNet18Classifier(), ResNet18Classifier(cifar_stem=True)
    assert plain(images).shape == cifar(images).shape == (2, 10)
    assert cifar.model.conv1.kernel_size == (3, 3) and isinstance(cifar.model.maxpool, torch.nn.Identity)
    assert plain.model.conv1.kernel_size == (7, 7)


def test_datamodule_yields_normalised_cifar_shaped_batches():
    dm = CIFAR10DataModule(batch_size=4, num_samples=10)
    dm.setup("fit")
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32
    assert labels.shape == (4,) and int(labels.min()) >= 0 and int(labels.max()) < 10
    # Normalize with the CIFAR10 mean/std maps [0, 1] pixels outside [0, 1]
    assert float(images.min()) < 0
    assert len(dm.train_dataloader()) == 10 // 4  # drop_last keeps every training batch full
    assert len(dm.val_dataloader().dataset) == 2  # a fifth, as CIFAR10's test set is of its training set


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(data="imagenet"), "`data` must be one of ['synthetic', 'cifar10'], got 'imagenet'"),
        (dict(batch_size=0), "`batch_size` must be an integer >= 1, got 0"),
        (dict(num_workers=-1), "`num_workers` must be an integer >= 0, got -1"),
        (dict(num_samples=0), "`num_samples` must be an integer >= 1, got 0"),
        (dict(persistent_workers=True), "`persistent_workers=True` needs `num_workers` > 0"),
    ],
)
def test_datamodule_rejects_bad_arguments_naming_them(kwargs, message):
    with pytest.raises(ValueError) as exc:
        CIFAR10DataModule(**kwargs)
    assert message in str(exc.value)


# ------------------------------------------------------------------------------------------ config.yaml


# Lightning 2.4.0's CLI stores `_class_path` in both the model's and the datamodule's hparams and then refuses to
# merge them (Lightning issue 20182; 2.5.6 and 2.6.6 pass): the config cannot train through a LightningCLI there
LIGHTNING_20182 = pytest.mark.skipif(
    lightning.__version__ == "2.4.0", reason="Lightning 2.4.0 bug #20182: `_class_path` in merged hparams"
)


@LIGHTNING_20182
def test_config_trains_through_the_example_script(tmp_path):
    cmd = [
        sys.executable,
        "examples/resnet18_cifar10.py",
        "fit",
        "--config",
        "examples/config.yaml",
        "--trainer.max_steps=12",
        "--trainer.limit_val_batches=2",
        "--trainer.enable_progress_bar=false",
        "--data.init_args.num_samples=128",
        "--data.init_args.batch_size=8",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
    ]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)

    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "resnet18_cifar10_cli" / "version_0"
    summary = RunSummary.load(run_dir / SUMMARY_FILENAME)
    assert summary.status == "finished"
    assert (summary.settings.batch_size, summary.settings.num_workers) == (8, 0)
    assert [t.steps for t in summary.traces] == RECORDED_STEPS
    assert len(trace_files(run_dir)) == 2
    assert (run_dir / "config.yaml").is_file()  # LightningCLI saved the resolved config beside the logs


def test_config_builds_with_plain_lightning_cli(tmp_path, monkeypatch):
    # `lightning-perf trial` runs the config through a plain LightningCLI(): class paths, no subclass limits
    monkeypatch.setattr(sys, "argv", ["lightning"])  # pytest's own arguments are not the CLI's
    cli = LightningCLI(
        run=False,
        args=["--config", str(CONFIG), f"--trainer.default_root_dir={tmp_path}"],
        save_config_callback=None,
    )

    assert isinstance(cli.model, ResNet18Classifier)
    assert isinstance(cli.datamodule, CIFAR10DataModule)
    assert cli.datamodule.hparams.data == "synthetic"
    (perf,) = [c for c in cli.trainer.callbacks if isinstance(c, PerfCallback)]
    schedule = perf.config.schedule
    assert (schedule.skip_first, schedule.wait, schedule.warmup, schedule.active, schedule.repeat) == (
        1,
        1,
        1,
        3,
        2,
    )


# ------------------------------------------------------------------------------------------ cnn_inference


def test_cnn_inference_smoke_writes_trace_scalars_histograms_and_graph(tmp_path, capsys):
    assert cnn_inference.main(["--smoke", "--log-dir", str(tmp_path)]) == 0

    run_dir = tmp_path / "cnn_inference" / "version_0"
    out = capsys.readouterr().out
    assert "inference:" in out and f"tensorboard --logdir {run_dir.parent}" in out
    summary = RunSummary.load(run_dir / "perf_summary_validate.json")
    assert summary.stage == "validate" and summary.status == "finished"
    assert [t.steps for t in summary.traces] == RECORDED_STEPS
    assert len(trace_files(run_dir)) == 2

    events = EventAccumulator(str(run_dir), size_guidance={"histograms": 0})
    events.Reload()
    tags = events.Tags()
    assert {"train_loss", "train_acc", "val_loss", "val_acc"} <= set(tags["scalars"])
    weights = {f"weights/net.{name}" for name, _ in cnn_inference.SmallCNN().named_parameters()}
    assert weights <= set(tags["histograms"])
    assert tags["graph"] is True
    graph_ops = {node.op for node in events.Graph().node}
    assert {"aten::_convolution", "aten::max_pool2d", "aten::linear"} <= graph_ops, graph_ops


def test_small_cnn_linear_layer_fits_28x28_inputs():
    model = cnn_inference.SmallCNN()
    assert model.classifier.in_features == 32 * 7 * 7
    assert model(torch.zeros(3, 1, 28, 28)).shape == (3, 10)


def test_cnn_inference_rejects_bad_flags_naming_them(capsys):
    with pytest.raises(SystemExit):
        cnn_inference.parse_args(["--batches", "0"])
    assert "--batches must be >= 1, got 0" in capsys.readouterr().err
