"""PerfCallback configured from a Lightning CLI YAML file: every argument, and a real fit."""

import inspect

import yaml
from lightning.pytorch.cli import LightningCLI

from lightning_perf import PerfCallback
from tests.helpers import TinyDataModule, TinyModel, trace_files

# a non-default value for every constructor argument: each must survive the YAML round trip
NON_DEFAULTS = {
    "skip_first": 1,
    "wait": 1,
    "warmup": 1,
    "active": 2,
    "repeat": 2,
    "activities": ["cpu"],
    "record_shapes": True,
    "profile_memory": True,
    "with_stack": True,
    "with_flops": True,
    "max_trace_mb": 123.5,
    "export_stacks": False,
    "export_speedscope": True,
    "export_memory_timeline": False,
    "enable_profiler": True,
    "batch_size": 7,
    "log_every_n_steps": 3,
    "log_min_interval_s": 0.5,
    "utilization": False,
    "util_interval_s": 0.25,
    "diagnose": False,
    "probe_num_workers": "never",
    "probe_budget_s": 2.5,
    "ab_cudnn_benchmark": False,
    "log_hparams": False,
    "trace_ranks": [0],
    "profile_on_slowdown": False,
    "flops_per_batch": 1.5e9,
}


def run_cli(tmp_path, init_args, *extra):
    config = {
        "trainer": {
            "default_root_dir": str(tmp_path),
            "max_epochs": 1,
            "limit_train_batches": 12,
            "limit_val_batches": 0,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "callbacks": [{"class_path": "lightning_perf.PerfCallback", "init_args": init_args}],
        },
        "data": {"n": 64},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return LightningCLI(
        TinyModel, TinyDataModule, args=["fit", "--config", str(path), *extra], save_config_callback=None
    )


def test_every_constructor_argument_is_settable_from_yaml(tmp_path):
    expected = set(inspect.signature(PerfCallback.__init__).parameters) - {"self", "dirpath"}
    assert set(NON_DEFAULTS) == expected
    cli = run_cli(tmp_path, {**NON_DEFAULTS, "dirpath": str(tmp_path / "traces")})
    (callback,) = [cb for cb in cli.trainer.callbacks if isinstance(cb, PerfCallback)]
    assert (
        callback.config.schedule.active == 2
        and callback.config.schedule.repeat == 2
        and callback.config.schedule.skip_first == 1
    )
    assert callback.config.activities == ("cpu",)
    for name, value in NON_DEFAULTS.items():
        if name in ("skip_first", "wait", "warmup", "active", "repeat", "activities", "trace_ranks"):
            continue
        assert getattr(callback.config, name) == value, name
    assert callback.config.dirpath == str(tmp_path / "traces")
    assert callback.config.trace_ranks == (0,) and callback.last_summary.trace_ranks == [0]
    # two cycles of two recorded batches, written where the YAML said
    assert len(trace_files(tmp_path / "traces")) == 2
    assert callback.last_summary.timing.samples == 7 * callback.last_summary.timing.steps


def test_yaml_with_defaults_writes_traces_to_the_run_log_dir(tmp_path):
    cli = run_cli(tmp_path, {"utilization": False, "diagnose": False}, "--trainer.limit_train_batches=15")
    files = trace_files(tmp_path)
    assert len(files) == 1  # default schedule: one window early in training
    assert cli.trainer.log_dir in files[0]


def test_trace_ranks_takes_a_word_or_a_list_from_yaml_and_the_command_line(tmp_path):
    cli = run_cli(tmp_path, {"trace_ranks": "all", "utilization": False, "diagnose": False})
    (callback,) = [cb for cb in cli.trainer.callbacks if isinstance(cb, PerfCallback)]
    assert callback.config.trace_ranks == "all"
    cli = run_cli(
        tmp_path,
        {"utilization": False, "diagnose": False},
        "--trainer.callbacks.init_args.trace_ranks=[0]",
    )
    (callback,) = [cb for cb in cli.trainer.callbacks if isinstance(cb, PerfCallback)]
    assert callback.config.trace_ranks == (0,)
