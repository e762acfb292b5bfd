"""The examples run end to end in their smoke modes: real Trainer runs, real TensorBoard files, the real CLI."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import lightning
import lightning as L
import pytest
import torch
from lightning.pytorch.cli import LightningCLI
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

# the examples need the `examples` extra (torchvision); the library does not
pytest.importorskip("torchvision")

from examples import case_study, cnn_inference, compiled_recompiles, resnet18_cifar10  # noqa: E402
from examples.batch_augment import augment_batch, normalize_batch  # noqa: E402
from examples.resnet18_cifar10 import CIFAR10DataModule, ResNet18Classifier  # noqa: E402
from lightning_perf import PerfCallback  # noqa: E402
from lightning_perf.analysis.diagnosis import diagnose  # noqa: E402
from lightning_perf.analysis.summary import SUMMARY_FILENAME, Finding, RunSummary  # noqa: E402
from tests.analysis.test_rules_pipeline import case_study as case_study_summary  # noqa: E402
from tests.helpers import trace_files  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "config.yaml"
# the case study's and the config's schedule: skip 1, then 2 cycles of 1 idle + 1 warm-up + 3 recorded
RECORDED_STEPS = [[3, 4, 5], [8, 9, 10]]


# ---------------------------------------------------------------------------------- resnet18_cifar10 study


def cpu_case_study_summary(path: Path) -> Path:
    """The 2-core CPU case study's 'before' run, diagnosed by the real rules, saved as a summary file."""
    summary = case_study_summary(accelerator="cpu")
    summary.findings = diagnose(summary)
    summary.save(path)
    return path


def test_case_study_smoke_builds_after_from_the_diagnosis_findings(tmp_path, capsys):
    benchmark_was = torch.backends.cudnn.benchmark
    args = case_study.parse_study_args(["--smoke", "--log-dir", str(tmp_path)])

    summary, plan = case_study.diagnose_and_plan(args)

    run = tmp_path / "resnet18_cifar10" / "diagnosis"
    saved = RunSummary.load(run / SUMMARY_FILENAME)
    assert saved.status == "finished" and saved.timing.steps > 0
    assert [t.steps for t in saved.traces] == RECORDED_STEPS and len(trace_files(run)) == 2
    assert [f.id for f in saved.findings] == [f.id for f in summary.findings]
    # every settings change of every finding got a decision; 'after' is 'before' plus the applied ones
    asked = [(f.id, k, v) for f in saved.findings for k, v in f.settings_change.items()]
    assert [(d.finding, d.key, d.value) for d in plan.decisions if d.key is not None] == asked
    before = case_study.base_setup(args)
    applied = {d.key: d.value for d in plan.applied}
    changed = {
        k: v
        for part in ("model", "data", "trainer")
        for k, v in getattr(plan.after, part).items()
        if getattr(before, part).get(k) != v
    }
    assert set(changed) == set(applied)
    out = capsys.readouterr().out
    assert "applied:" in out and "not applied:" in out
    assert torch.backends.cudnn.benchmark == benchmark_was  # Trainer(benchmark=...) set it process-wide


def test_after_of_the_cpu_case_study_takes_the_batched_transforms_recipe():
    summary = case_study_summary(accelerator="cpu")
    findings = diagnose(summary)
    before = case_study.base_setup(case_study.parse_study_args([]))

    plan = case_study.plan_after(before, findings, cuda=False)

    assert plan.after.model["batched_transforms"] is True and plan.after.data["batched_transforms"] is True
    assert plan.after.data["num_workers"] == 0 and plan.after.trainer == before.trainer
    # with the recipe found, the diagnosis itself asks for no workers (one voice), so none is left to refuse
    (input_bound,) = [f for f in findings if f.id == "input_bound"]
    assert "num_workers" not in input_bound.settings_change
    assert ("input_bound", "num_workers") not in {(d.finding, d.key) for d in plan.not_applied}


def test_plan_applies_what_the_example_knows_and_says_why_not_the_rest():
    findings = [
        Finding("mixed_precision", "medium", "t", "e", "r", {"precision": "bf16-mixed"}),
        Finding("input_bound", "high", "t", "e", "r", {"num_workers": 6}),
        Finding("workers_exceed_cores", "medium", "t", "e", "r", {"num_workers": 3}),
        Finding("pin_memory", "medium", "t", "e", "r", {"pin_memory": True}),
        Finding("cudnn_benchmark", "medium", "t", "e", "r", {"benchmark": True}),
        Finding("low_gpu_util", "medium", "t", "e", "r", {"batch_size": 128}),
        Finding("future_rule", "low", "t", "e", "r", {"channels_last": True}),
        Finding("persistent_workers", "low", "t", "e", "r", {"persistent_workers": True}),
        Finding("straggler", "info", "Rank 1 is slow", "e", "r"),
    ]
    before = case_study.base_setup(case_study.parse_study_args([]))

    gpu = case_study.plan_after(before, findings, cuda=True)
    cpu = case_study.plan_after(before, findings, cuda=False)

    assert gpu.after.trainer["precision"] == "bf16-mixed" and gpu.after.trainer["benchmark"] is True
    assert (gpu.after.data["num_workers"], gpu.after.data["pin_memory"]) == (6, True)
    assert gpu.after.data["batch_size"] == before.data["batch_size"]
    reasons = {(d.finding, d.key): d.reason for d in gpu.not_applied}
    assert reasons == {
        ("workers_exceed_cores", "num_workers"): "already set by input_bound",
        ("low_gpu_util", "batch_size"): case_study.NOT_APPLICABLE["batch_size"],
        ("future_rule", "channels_last"): "the example does not know how to apply it",
        ("straggler", None): "advice only: Rank 1 is slow",
    }
    assert gpu.after.data["persistent_workers"] is True  # with the 6 workers input_bound asked for
    assert cpu.after.trainer == before.trainer and "pin_memory" not in cpu.after.data
    # torch refuses persistent_workers without workers: not applied when no finding asked for workers
    persistent = Finding("persistent_workers", "low", "t", "e", "r", {"persistent_workers": True})
    no_workers = case_study.plan_after(before, [persistent], cuda=True)
    assert [d.reason for d in no_workers.decisions] == ["needs num_workers > 0"]
    assert "persistent_workers" not in no_workers.after.data
    assert {d.key for d in cpu.not_applied if d.reason == "needs a CUDA device"} == {
        "precision",
        "benchmark",
        "pin_memory",
    }
    assert "not applied:" in gpu.render() and "precision='bf16-mixed'" in gpu.render()


def test_case_study_measures_before_and_after_with_an_interval(tmp_path, capsys):
    pytest.importorskip(
        "lightning_perf.analysis.verdicts.statistics", reason="the repeated measurement (issue 16)"
    )
    from lightning_perf.analysis.verdicts.statistics import MetricChange  # noqa: F401  (the contract's class)

    findings = cpu_case_study_summary(tmp_path / "before.json")
    argv = ["--smoke", "--from-summary", str(findings), "--log-dir", str(tmp_path)]

    assert resnet18_cifar10.main(argv) == 0

    out = capsys.readouterr().out
    assert "batched_transforms" in out.split("not applied:")[0]  # listed as applied
    verdict = out.rstrip().splitlines()[-1]  # the study's last line
    assert verdict.startswith("case study verdict: "), out
    found = re.search(r"(faster|slower) than before \(95% interval (\d+\.\d+)x-(\d+\.\d+)x\)$", verdict)
    if found:  # the change and its interval read the same way: both bounds above 1
        assert 1.0 < float(found[2]) <= float(found[3]), verdict
    else:
        assert re.search(
            r"^case study verdict: no measurable difference .*95% interval [\d.]+x-[\d.]+x\)$", verdict
        )
    assert "method: mean step time" in out
    assert f"tensorboard --logdir {tmp_path / 'resnet18_cifar10'}" in out


def test_the_tune_mode_hands_the_example_config_to_lightning_perf_tune(capsys):
    assert resnet18_cifar10.main(["tune", "--budget-s", "0"]) == 2  # refused before anything runs
    assert "lightning-perf tune: error: --budget-s must be a number of seconds > 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--steps", "0"], "--steps must be > 0, got 0"),
        (["--batch-size", "-1"], "--batch-size must be > 0, got -1"),
        (["--repeats", "0"], "--repeats must be > 0, got 0"),
        (["--data", "imagenet"], "invalid choice: 'imagenet'"),
    ],
)
def test_case_study_rejects_bad_flags_naming_them(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        case_study.parse_study_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_batch_augmentation_is_a_padded_crop_and_flip_of_each_image():
    images = torch.randint(0, 256, (6, 3, 8, 8), dtype=torch.uint8)
    mean, std = torch.tensor([0.5, 0.4, 0.3]), torch.tensor([0.2, 0.25, 0.3])
    out = augment_batch(images, mean, std, padding=2, generator=torch.Generator().manual_seed(1))

    assert out.shape == images.shape and out.dtype == torch.float32
    pixels = (out * std.view(1, 3, 1, 1) + mean.view(1, 3, 1, 1)) * 255
    padded = torch.nn.functional.pad(images, (2, 2, 2, 2)).float()
    for image, got in zip(padded, pixels, strict=True):
        windows = [image[:, y : y + 8, x : x + 8] for y in range(5) for x in range(5)]
        candidates = windows + [w.flip(2) for w in windows]
        assert any(torch.allclose(got, c, atol=1e-3) for c in candidates)
    assert torch.allclose(normalize_batch(images, mean, std)[:, 0], (images[:, 0] / 255 - 0.5) / 0.2)
    with pytest.raises(ValueError, match="expected a uint8 batch"):
        augment_batch(images.float(), mean, std)


def test_batched_setup_trains_with_uint8_batches_augmented_on_the_module(tmp_path):
    dm = CIFAR10DataModule(batch_size=4, num_samples=16, batched_transforms=True)
    dm.setup("fit")
    images, labels = next(iter(dm.train_dataloader()))
    assert images.dtype == torch.uint8 and images.shape == (4, 3, 32, 32) and labels.dtype == torch.int64
    model = ResNet18Classifier(batched_transforms=True)
    normalized, _ = model.eval().on_after_batch_transfer((images, labels), 0)
    assert normalized.dtype == torch.float32 and float(normalized.min()) < 0
    with pytest.raises(ValueError, match="expects uint8 images"):
        model.on_after_batch_transfer((normalized, labels), 0)

    trainer = L.Trainer(
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        limit_val_batches=1,
    )
    trainer.fit(model, datamodule=dm)
    assert trainer.global_step == 3 and torch.isfinite(trainer.callback_metrics["train_loss"])


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


# ------------------------------------------------------------------------------------ compiled_recompiles


def test_compiled_recompiles_names_the_recompiles_and_the_fix_removes_them(tmp_path, capsys):
    assert compiled_recompiles.main(["--steps", "12", "--log-dir", str(tmp_path)]) == 0

    out = capsys.readouterr().out
    assert "torch.compile recompiles: dimension 1 of `batch[0]` varies" in out
    assert "size mismatch at index 1" in out and "settings change: {'dynamic': True}" in out
    assert "after: 1 compilation(s), 0 recompile(s)" in out and "after: no recompilation finding" in out
    before = RunSummary.load(tmp_path / "compiled_recompiles" / "before")
    after = RunSummary.load(tmp_path / "compiled_recompiles" / "after")
    assert before.compile.recompiles >= 5 and before.compile.steps_excluded >= 5
    assert after.compile.recompiles == 0 and before.timing.steps < after.timing.steps


def test_compiled_recompiles_rejects_bad_flags_naming_them(capsys):
    with pytest.raises(SystemExit):
        compiled_recompiles.parse_args(["--steps", "0"])
    assert "--steps must be >= 1, got 0" in capsys.readouterr().err
