"""The ResNet-18 case study: ``lightning-perf tune`` on the example's own Lightning CLI config.

What a user runs on their own project, here on this one:

1. *config*: ``examples/config.yaml`` (per-sample PIL transforms in the DataLoader, ``num_workers=0``,
   cudnn.benchmark off, full precision), copied into the study's log dir with the study's flags applied
   (batch size, data, accelerator, stem), so the source tree gets no tuned file.
2. *tune* (:func:`lightning_perf.tune.run.run_tune`, what ``lightning-perf tune`` runs): a diagnosis fit with
   PerfCallback and its num_workers probe; a candidate for each settings change of the findings that the config
   can express, and their combination. Nothing is given by hand: with 0 workers the loading is paid inside every
   step, so the diagnosis asks for a first worker; where the CPU is full with per-sample transforms it names the
   ``batched_transforms`` recipe, which this example switches on by its ``batched_transforms`` arguments
   (``examples/batch_augment.py``), so tune tries it too. Baseline and candidates run in interleaved, rotated
   rounds; the fastest significantly faster one is written as ``config.tuned.yaml``.
3. *verdict*: *before* is the config as given, *after* the tuned one; the last line gives the speed-up of the
   mean step time in one direction with its interval:
   ``case study verdict: after is 1.40x faster than before (95% interval 1.32x-1.49x)``.

Every run is a TensorBoard run under ``<log dir>/resnet18_cifar10/tune``: ``diagnosis``, ``<variant>/round_<i>``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from examples.demo_sizing import size_study
from examples.resnet18_cifar10 import CONFIG_PATH, DATA_CHOICES
from lightning_perf.trial.decision import METHOD, Speed
from lightning_perf.trial.proposals import MACHINE_FINDING
from lightning_perf.trial.tuned_config import apply_changes

STUDY_NAME = "resnet18_cifar10"
TUNE_EXPERIMENT = "tune"
STUDY_CONFIG = "config.yaml"
# The code-side recipe of the `batched_transforms` finding, as this example implements it: its model and
# datamodule take a `batched_transforms` argument, so `tune` finds the switch and tries the recipe itself.
RECIPE = "batched_transforms"
# The steps, the batch and the budget are sized to a step timed on this machine first (examples/demo_sizing.py):
# 64 images a batch (halved while a step takes over a second), ~6 s of timed steps a run, and the budget the
# diagnosis and the planned rounds need; a flag given wins over its sized value.
DEFAULT_REPEATS = 5  # 3 rounds leave a t-interval with 2 degrees of freedom: too wide for a 1.2-1.4x change
DEFAULT_BATCH_SIZE = 64
# --smoke (the tests): tiny batches, a few steps, the 2 rounds an interval needs
SMOKE_STEPS = 4
SMOKE_BATCH_SIZE = 8
SMOKE_NUM_SAMPLES = 256
SMOKE_REPEATS = 2


def study_dir(args: argparse.Namespace) -> str:
    return os.path.join(args.log_dir, STUDY_NAME)


def study_config_changes(args: argparse.Namespace) -> dict[str, Any]:
    """The study's flags as changes of ``examples/config.yaml`` (dotted keys)."""
    changes: dict[str, Any] = {
        "data.init_args.data": args.data,
        "data.init_args.data_dir": args.data_dir,
        "data.init_args.batch_size": args.batch_size,
        "model.init_args.cifar_stem": args.cifar_stem,
        "trainer.accelerator": args.accelerator,
    }
    if args.smoke:
        changes["data.init_args.num_samples"] = SMOKE_NUM_SAMPLES
    return changes


def write_study_config(args: argparse.Namespace) -> str:
    """``<study dir>/config.yaml``: the example's config with the study's flags, the file ``tune`` is given."""
    import yaml

    config = yaml.safe_load(CONFIG_PATH.read_text(encoding="utf-8"))
    path = os.path.join(study_dir(args), STUDY_CONFIG)
    os.makedirs(study_dir(args), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(
            f"# {os.path.relpath(CONFIG_PATH)} with the case study's flags (written by the case study)\n"
        )
        yaml.safe_dump(apply_changes(config, study_config_changes(args)), fh, sort_keys=False)
    return path


def user_command(args: argparse.Namespace, config: str) -> str:
    """The ``lightning-perf tune`` command line the study runs, as a user would type it."""
    argv = ["lightning-perf", "tune", "--config", config, "--steps", str(args.steps)]
    argv += ["--repeats", str(args.repeats), "--budget-s", f"{args.budget_s:g}"]
    return shlex.join(argv)


def size_args(args: argparse.Namespace) -> None:
    """Fill the steps, batch and budget not given from a step timed here, and say how long the study takes."""
    batch_size = args.batch_size or DEFAULT_BATCH_SIZE
    print(
        f"Timing a training step of ResNet-18 at {batch_size} images a batch on this machine ...", flush=True
    )
    size = size_study(batch_size, args.repeats, args.steps, fixed_batch=args.batch_size is not None)
    args.batch_size, args.steps = size.batch_size, size.steps
    if args.budget_s is None:
        args.budget_s = size.budget_s
    minutes = size.expected_s(args.repeats) / 60
    print(
        f"a step takes {size.step_s:.2f} s at {args.batch_size} images: {args.steps} timed steps a run, "
        f"{args.repeats} rounds, a budget of {args.budget_s:g} s; the study takes about {minutes:.0f} min "
        f"(the diagnosis, then every round of before and of tune's proposals)\n",
        flush=True,
    )


def held_by_others(result: Any) -> bool:
    """The diagnosis proposed nothing because other processes held the cores (tune's ``noisy_machine``)."""
    busy = any(f.id == MACHINE_FINDING and f.severity == "high" for f in result.findings)
    return busy and not result.candidates


def recipe_variant() -> Any:
    """The example's recipe switch as a user's own ``--variant`` (both of its ``batched_transforms`` arguments)."""
    from lightning_perf.tune.variants import VariantArg

    keys = ("model.init_args.batched_transforms", "data.init_args.batched_transforms")
    return VariantArg(RECIPE, [(key, "true") for key in keys])


def run_tune_study(args: argparse.Namespace, extra: Sequence[Any] = ()) -> Any:
    """Write the study's config and tune it (the Python API of ``lightning-perf tune``): a TuneResult."""
    from lightning_perf.tune.run import run_tune

    if args.steps is None or args.batch_size is None or args.budget_s is None:
        size_args(args)
    config = write_study_config(args)
    command = user_command(args, config) + "".join(
        f" --variant {v.name}:" + ",".join(f"{k}={t}" for k, t in v.overrides) for v in extra
    )
    experiment = os.path.join(study_dir(args), TUNE_EXPERIMENT)
    if os.path.isdir(experiment):  # a rerun replaces the runs, so TensorBoard never mixes two studies
        print(f"replacing the previous runs in {experiment}")
        shutil.rmtree(experiment)
    tuned = os.path.join(study_dir(args), "config.tuned.yaml")
    if os.path.exists(tuned):  # a stale tuned config must not pass for this run's
        os.remove(tuned)
    # the workers import the config's examples.* classes: the repository root on their path
    root = str(Path(__file__).resolve().parents[1])
    if root not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    print(
        f"Case study: ResNet-18 on {args.data} CIFAR10-shaped data, {args.batch_size} images per batch.\n"
        f"config: {config} ({os.path.relpath(CONFIG_PATH)} with the study's flags)\n"
        f"what a user runs on their own project (after: tune's own proposals from the diagnosis of before):\n"
        f"  {command}\n",
        flush=True,
    )
    return run_tune(
        config,
        steps=args.steps,
        repeats=args.repeats,
        budget_s=args.budget_s,
        log_dir=study_dir(args),
        name=TUNE_EXPERIMENT,
        extra=list(extra),
    )


def after_speed(result: Any) -> Speed | None:
    """*after*'s speed-up over *before*: tune's winner, else its best measured candidate (None: none measured)."""
    measured = [s for s in result.speeds if s.error is None and s.speedup is not None and s.low is not None]
    winner = [s for s in measured if s.name == result.decision.winner]
    if winner:
        return winner[0]
    return max(measured, key=lambda s: s.speedup or 0.0, default=None)


def verdict_line(speed: Speed) -> str:
    """The study's last line, in one direction (``after is 1.40x faster than before (95% interval
    1.32x-1.49x)``; a slowdown as ``1.25x slower`` with its interval as slowdowns)."""
    level = f"{speed.confidence:.0%} interval"
    assert speed.speedup is not None and speed.low is not None and speed.high is not None
    if speed.low > 1.0:
        return (
            f"case study verdict: after is {speed.speedup:.2f}x faster than before "
            f"({level} {speed.low:.2f}x-{speed.high:.2f}x)"
        )
    slower = f"{1 / speed.speedup:.2f}x slower ({level} {1 / speed.high:.2f}x-{1 / speed.low:.2f}x)"
    if speed.high < 1.0:
        return f"case study verdict: after is {slower.replace(' (', ' than before (')}"
    estimate = (
        f"{speed.speedup:.2f}x faster, {level} {speed.low:.2f}x-{speed.high:.2f}x"
        if speed.speedup >= 1.0
        else slower.replace(" (", ", ").rstrip(")")
    )
    return f"case study verdict: no measurable difference between after and before (estimate {estimate})"


def run_study(args: argparse.Namespace) -> int:
    started = time.monotonic()
    result = run_tune_study(args)
    if held_by_others(result):
        # A busy machine hides the loading cost the diagnosis looks for, so tune proposes nothing; the demo still
        # owes a measured before/after: it measures the example's recipe as the user's own candidate (a wider
        # interval where others' work disturbs the rounds).
        print(
            f"\n{result.decision.line}\nother processes held the cores during the diagnosis, so it proposed "
            f"nothing; measuring the example's {RECIPE} recipe as your own candidate instead\n",
            flush=True,
        )
        # within the study's one budget: the second tune gets what the first left
        args.budget_s = max(args.budget_s - (time.monotonic() - started), 1.0)
        result = run_tune_study(args, extra=[recipe_variant()])
    print()
    print(result.render(), end="")
    speed = after_speed(result)
    after = result.tuned_path or "(no tuned config: the best candidate was not significantly faster)"
    print(
        f"\nOpen every run in TensorBoard (Scalars, Text, PyTorch Profiler tabs):\n"
        f"  tensorboard --logdir {os.path.join(study_dir(args), TUNE_EXPERIMENT)}\n"
    )
    # tune gave no verdict (the machine was busy, nothing measured): neither does the study
    if speed is None or not result.decision.judged:
        why = "; ".join([result.decision.line.removeprefix("not measured: "), *result.notes])
        print(f"case study verdict: not measured ({why})")
        # an honest answer, not a failure: `make demo` must not end in "make: *** Error 1" on a busy machine
        return 0
    applied = next((c.findings for c in result.candidates if c.name == speed.name), [])
    source = (
        "your own --variant: the example's recipe"
        if applied == ["--variant"]
        else f"tune's proposal from the finding{'s' if len(applied) != 1 else ''} {', '.join(applied)}"
    )
    print(
        f"before: {os.path.join(study_dir(args), STUDY_CONFIG)}; after: {speed.label} ({source}) -> {after}"
    )
    print(f"method: mean step time after against before; {METHOD}")
    print(verdict_line(speed))  # the last line
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python examples/resnet18_cifar10.py",
        description=(
            "Run the ResNet-18 case study: `lightning-perf tune` on the example's Lightning CLI config, "
            "before/after with its interval. Give a Lightning CLI subcommand (fit, validate, test, predict) "
            "instead to train with LightningCLI, e.g. `fit --config examples/config.yaml`."
        ),
    )
    parser.add_argument("command", nargs="?", choices=["study"], default="study", help="the case study")
    parser.add_argument("--steps", type=int, help="timed steps per measured run (default: ~6 s of steps)")
    parser.add_argument("--repeats", type=int, help=f"interleaved rounds (default {DEFAULT_REPEATS})")
    parser.add_argument("--batch-size", type=int, help=f"images per batch (default {DEFAULT_BATCH_SIZE})")
    parser.add_argument(
        "--budget-s", type=float, help="seconds for the whole tune (default: what its rounds need here)"
    )
    parser.add_argument("--accelerator", default="auto", help="Lightning accelerator: auto, cpu, gpu, ...")
    parser.add_argument(
        "--data", choices=DATA_CHOICES, default="synthetic", help="data set (default synthetic)"
    )
    parser.add_argument(
        "--data-dir", default="data", help="where CIFAR10 is downloaded (with --data cifar10)"
    )
    parser.add_argument("--log-dir", default="perf_logs", help="TensorBoard log root (default perf_logs)")
    parser.add_argument("--cifar-stem", action="store_true", help="3x3 stem without max-pool (16x compute)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for tests")
    return parser


def parse_study_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.repeats is None:
        args.repeats = SMOKE_REPEATS if args.smoke else DEFAULT_REPEATS
    if args.smoke:  # fixed tiny sizes; the budget still sized to this machine's step
        args.steps = SMOKE_STEPS if args.steps is None else args.steps
        args.batch_size = SMOKE_BATCH_SIZE if args.batch_size is None else args.batch_size
    for name in ("steps", "repeats", "batch_size", "budget_s"):  # None: sized to the timed step
        if getattr(args, name) is not None and not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.repeats < 2:
        parser.error(f"--repeats must be >= 2 (one round gives no interval), got {args.repeats}")
    return args


__all__ = ["after_speed", "parse_study_args", "run_study", "run_tune_study", "verdict_line"]
