"""The ResNet-18 case study: measure, diagnose, apply the tool's own advice, verify.

1. *diagnosis*: train ``before`` (per-sample PIL transforms, ``num_workers=0``, cudnn.benchmark off, full
   precision) once with ``PerfCallback``, which diagnoses the run and measures the num_workers probe.
2. *plan*: build ``after`` from that run's findings: every settings change the example knows how to apply
   (``num_workers`` and the other DataLoader settings, ``Trainer(benchmark=True)``, ``precision``, the
   ``batched_transforms`` recipe) is applied; the others are listed with the reason they were not.
3. *measure*: ``lightning_perf.run_trial`` runs before and after in interleaved rounds and gives the
   verdict on the mean step time (what training waits for) with its interval, as its last line:
   ``case study verdict: after is 1.40x faster than before (95% interval 1.32x-1.49x)``.

Every run is a TensorBoard run under ``<log dir>/resnet18_cifar10``: ``diagnosis`` and ``measured/...``.
"""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from examples.resnet18_cifar10 import (
    CIFAR10_TRAIN_SIZE,
    DATA_CHOICES,
    SEED,
    CIFAR10DataModule,
    ResNet18Classifier,
)
from lightning_perf import PerfCallback
from lightning_perf.analysis.rules.helpers import on_cuda
from lightning_perf.analysis.summary import Finding, RunSummary

STUDY_NAME = "resnet18_cifar10"
DIAGNOSIS_RUN = "diagnosis"
MEASURED_EXPERIMENT = "measured"
# the profiling schedule: two cycles of 3 recorded steps, after 1 skipped, 1 idle and 1 warm-up
STUDY_SCHEDULE = dict(skip_first=1, wait=1, warmup=1, active=3, repeat=2)
# Sizes for the 2-core CPU machine of the README (a step of 64 images ~140 ms before, ~100 ms after): the
# diagnosis run (60 steps + the 10 s num_workers probe) and 3 rounds of before/after at 100 steps each take
# about 2.5 minutes there. A GPU user raises --steps (its steps are ~10x shorter).
DEFAULT_DIAGNOSIS_STEPS = 60
DEFAULT_STEPS = 100
DEFAULT_REPEATS = 3
DEFAULT_BATCH_SIZE = 64
DEFAULT_PROBE_BUDGET_S = 10.0
# --smoke: just past the schedule's last recorded step (1 + 2 * (1 + 1 + 3) = 11 batches), tiny batches
SMOKE_STEPS = 12
# the measured runs of --smoke: a few steps each, not profiled (the diagnosis run holds the traces)
SMOKE_MEASURE_STEPS = 4
SMOKE_BATCH_SIZE = 8
SMOKE_NUM_SAMPLES = 256
SMOKE_REPEATS = 2
SMOKE_PROBE_BUDGET_S = 2.0
LOG_EVERY_N_STEPS = 10

DATALOADER_KEYS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")
CUDA_ONLY_KEYS = ("pin_memory", "benchmark", "precision")
# DataLoader arguments that torch accepts only with workers
WORKER_ONLY_KEYS = ("persistent_workers", "prefetch_factor")
# worker settings measured on the per-sample pipeline: they do not carry over once batched transforms replace it
WORKER_KEYS = ("num_workers", "persistent_workers", "prefetch_factor")
NOT_APPLICABLE = {
    "batch_size": "a different batch size changes the work per step, so step times would not compare",
    "check_val_every_n_epoch": "the measured runs do no validation",
    "every_n_epochs": "the measured runs save no checkpoints",
}


@dataclass(frozen=True)
class Setup:
    """How one variant is built: arguments of the model, the data module and the Trainer."""

    model: dict[str, Any]
    data: dict[str, Any]
    trainer: dict[str, Any]


@dataclass
class Decision:
    """One settings change of one finding, and whether the example applied it (``reason`` says why not)."""

    finding: str
    key: str | None
    value: Any = None
    reason: str | None = None

    @property
    def applied(self) -> bool:
        return self.key is not None and self.reason is None

    def render(self) -> str:
        change = f"{self.key}={self.value!r}" if self.key is not None else "(no settings change)"
        return f"  {self.finding:<22} {change}" + (f": {self.reason}" if self.reason else "")


@dataclass
class Plan:
    after: Setup
    decisions: list[Decision] = field(default_factory=list)

    @property
    def applied(self) -> list[Decision]:
        return [d for d in self.decisions if d.applied]

    @property
    def not_applied(self) -> list[Decision]:
        return [d for d in self.decisions if not d.applied]

    def render(self) -> str:
        lines = ["applied:"] + [d.render() for d in self.applied or [Decision("(none)", None)]]
        lines += ["not applied:"] + [d.render() for d in self.not_applied or [Decision("(none)", None)]]
        return "\n".join(lines)


def base_setup(args: argparse.Namespace) -> Setup:
    """*before*: per-sample transforms in the training process, cudnn.benchmark off, full precision."""
    return Setup(
        model={"cifar_stem": args.cifar_stem},
        data={
            "data": args.data,
            "data_dir": args.data_dir,
            "batch_size": args.batch_size,
            "num_workers": 0,
            "num_samples": SMOKE_NUM_SAMPLES if args.smoke else CIFAR10_TRAIN_SIZE,
        },
        trainer={"accelerator": args.accelerator, "devices": 1, "benchmark": False, "precision": "32-true"},
    )


def plan_after(before: Setup, findings: Sequence[Finding], cuda: bool) -> Plan:
    """*after*: ``before`` with every settings change of ``findings`` (most severe first) the example knows.

    A key set by an earlier finding keeps its value; worker settings are left out when the batched-transforms
    recipe is applied, since they were measured on the per-sample pipeline it replaces.
    """
    model, data, trainer = dict(before.model), dict(before.data), dict(before.trainer)
    batched = any(f.settings_change.get("batched_transforms") is True for f in findings)
    decisions: list[Decision] = []
    set_by: dict[str, str] = {}
    for finding in findings:
        if not finding.settings_change:
            decisions.append(Decision(finding.id, None, reason="advice only: " + finding.title))
        for key, value in finding.settings_change.items():
            decision = Decision(finding.id, key, value)
            decisions.append(decision)
            if key in set_by:
                decision.reason = f"already set by {set_by[key]}"
            elif batched and key in WORKER_KEYS:
                decision.reason = "measured on the per-sample pipeline that batched transforms replace"
            elif key in NOT_APPLICABLE:
                decision.reason = NOT_APPLICABLE[key]
            elif key == "batched_transforms" and value is True:
                model["batched_transforms"] = data["batched_transforms"] = True
            elif key in CUDA_ONLY_KEYS and not cuda:
                decision.reason = "needs a CUDA device"
            elif key in DATALOADER_KEYS:
                data[key] = value
            elif key in ("benchmark", "precision"):
                trainer[key] = value
            else:
                decision.reason = "the example does not know how to apply it"
            if decision.applied:
                set_by[key] = finding.id
    for decision in decisions:
        if decision.applied and decision.key in WORKER_ONLY_KEYS and not data["num_workers"]:
            decision.reason = "needs num_workers > 0"
            data.pop(decision.key)
    return Plan(Setup(model, data, trainer), decisions)


def run_diagnosis(args: argparse.Namespace, before: Setup) -> RunSummary:
    """Train *before* once with PerfCallback (num_workers probe on), logged as ``<study>/diagnosis``."""
    logger = TensorBoardLogger(save_dir=study_dir(args), name="", version=DIAGNOSIS_RUN)
    if os.path.isdir(logger.log_dir):
        # a rerun replaces the run, so TensorBoard and the profiler tab never mix two runs' files
        print(f"replacing the previous run in {logger.log_dir}")
        shutil.rmtree(logger.log_dir)
    L.seed_everything(SEED, verbose=False)
    perf = PerfCallback(**STUDY_SCHEDULE, probe_budget_s=args.probe_budget_s)
    benchmark_was = torch.backends.cudnn.benchmark
    try:
        trainer = L.Trainer(
            max_steps=args.diagnosis_steps,
            logger=logger,
            callbacks=[perf],
            log_every_n_steps=min(LOG_EVERY_N_STEPS, args.diagnosis_steps),
            limit_val_batches=0,
            num_sanity_val_steps=0,
            enable_checkpointing=False,
            enable_model_summary=False,
            **before.trainer,
        )
        trainer.fit(ResNet18Classifier(**before.model), datamodule=CIFAR10DataModule(**before.data))
    finally:
        torch.backends.cudnn.benchmark = benchmark_was  # Trainer(benchmark=...) sets it process-wide
    if perf.last_summary is None:
        raise RuntimeError("the diagnosis run finished without a performance summary")
    return perf.last_summary


def trial_variant(name: str, setup: Setup, args: argparse.Namespace) -> Any:
    from lightning_perf import Variant

    def make_model() -> ResNet18Classifier:
        L.seed_everything(SEED, verbose=False)  # the same initial weights in every run
        return ResNet18Classifier(**setup.model)

    return Variant(
        name,
        make_model,
        lambda: CIFAR10DataModule(**setup.data),
        trainer_kwargs={**setup.trainer, "log_every_n_steps": min(LOG_EVERY_N_STEPS, args.steps)},
        callback_kwargs={"enable_profiler": False} if args.smoke else dict(STUDY_SCHEDULE),
    )


def verdict_line(change: Any) -> str:
    """The study's last line, from the trial's MetricChange of the mean step time: the change and its interval
    in one direction (``after is 1.40x faster than before (95% interval 1.32x-1.49x)``)."""
    interval = f"{change.confidence:.0%} interval {change.factor_low:.2f}x-{change.factor_high:.2f}x"
    if change.significant:
        return (
            f"case study verdict: after is {change.factor:.2f}x {change.direction} than before ({interval})"
        )
    return (
        "case study verdict: no measurable difference between after and before "
        f"(estimate {change.factor:.2f}x {change.direction}, {interval})"
    )


def method_line(change: Any) -> str:
    return f"method: mean step time after against before; {change.method}"


def study_dir(args: argparse.Namespace) -> str:
    return os.path.join(args.log_dir, STUDY_NAME)


def diagnose_and_plan(args: argparse.Namespace) -> tuple[RunSummary, Plan]:
    before = base_setup(args)
    what = (
        f"{args.diagnosis_steps} steps of 'before' (per-sample transforms, num_workers=0)"
        if args.from_summary is None
        else f"the findings saved in {args.from_summary}"
    )
    print(
        f"Case study: ResNet-18 on {args.data} CIFAR10-shaped data, {args.batch_size} images per batch.\n"
        f"1. diagnosis: {what}\n",
        flush=True,
    )
    if args.from_summary is None:
        summary, source = run_diagnosis(args, before), "the diagnosis run"
    else:
        summary, source = RunSummary.load(args.from_summary), args.from_summary
    plan = plan_after(before, summary.findings, on_cuda(summary))
    print(f"\n2. 'after' built from the {len(summary.findings)} findings of {source}:\n{plan.render()}\n")
    return summary, plan


def measure(args: argparse.Namespace, plan: Plan) -> Any:
    """Before and after in ``args.repeats`` interleaved rounds (``lightning_perf.run_trial``): a TrialResult."""
    from lightning_perf import run_trial

    print(
        f"3. measure: {args.repeats} interleaved rounds of before/after, {args.steps} steps each\n",
        flush=True,
    )
    variants = [trial_variant("before", base_setup(args), args), trial_variant("after", plan.after, args)]
    return run_trial(
        variants,
        args.steps,
        log_dir=study_dir(args),
        name=MEASURED_EXPERIMENT,
        progress=True,
        overwrite=True,
        repeats=args.repeats,
    )


def after_change(result: Any) -> Any:
    """The trial's MetricChange of 'after' against 'before' (mean step time), or None when not measured."""
    changes = getattr(result.comparison, "changes", None) or {}
    return changes.get("after")


def run_study(args: argparse.Namespace) -> int:
    summary, plan = diagnose_and_plan(args)
    if not plan.applied:
        print(
            "No finding asked for a change the example can apply: 'after' would be 'before'; nothing to measure."
        )
        return 0
    result = measure(args, plan)
    change = after_change(result)
    print(
        f"\nOpen every run in TensorBoard (Scalars, Text, PyTorch Profiler tabs):\n  tensorboard --logdir {study_dir(args)}\n"
    )
    if change is not None:
        print(method_line(change))
        print(verdict_line(change))  # the last line
    else:
        print("case study verdict: not measured (" + ("; ".join(result.notes) or "no comparison") + ")")
    return 0 if change is not None else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python examples/resnet18_cifar10.py",
        description=(
            "Run the ResNet-18 case study: diagnose 'before' with PerfCallback, build 'after' from its findings, "
            "measure both in interleaved rounds. Give a Lightning CLI subcommand (fit, validate, test, predict) "
            "instead to train with LightningCLI, e.g. `fit --config examples/config.yaml`."
        ),
    )
    parser.add_argument("command", nargs="?", choices=["study"], default="study", help="the case study")
    parser.add_argument("--steps", type=int, help=f"steps per measured run (default {DEFAULT_STEPS})")
    parser.add_argument(
        "--diagnosis-steps", type=int, help=f"steps of the diagnosis run (default {DEFAULT_DIAGNOSIS_STEPS})"
    )
    parser.add_argument(
        "--repeats", type=int, help=f"interleaved before/after rounds (default {DEFAULT_REPEATS})"
    )
    parser.add_argument("--batch-size", type=int, help=f"images per batch (default {DEFAULT_BATCH_SIZE})")
    parser.add_argument("--probe-budget-s", type=float, help="seconds for the num_workers probe (default 10)")
    parser.add_argument("--accelerator", default="auto", help="Lightning accelerator: auto, cpu, gpu, ...")
    parser.add_argument(
        "--data", choices=DATA_CHOICES, default="synthetic", help="data set (default synthetic)"
    )
    parser.add_argument(
        "--data-dir", default="data", help="where CIFAR10 is downloaded (with --data cifar10)"
    )
    parser.add_argument("--log-dir", default="perf_logs", help="TensorBoard log root (default perf_logs)")
    parser.add_argument("--cifar-stem", action="store_true", help="3x3 stem without max-pool (16x compute)")
    parser.add_argument(
        "--from-summary",
        metavar="PATH",
        help="build 'after' from the findings of this perf_summary.json (or its run folder) instead of "
        "running the diagnosis",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for tests")
    return parser


def parse_study_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    defaults = {
        "steps": SMOKE_MEASURE_STEPS if args.smoke else DEFAULT_STEPS,
        "diagnosis_steps": SMOKE_STEPS if args.smoke else DEFAULT_DIAGNOSIS_STEPS,
        "repeats": SMOKE_REPEATS if args.smoke else DEFAULT_REPEATS,
        "batch_size": SMOKE_BATCH_SIZE if args.smoke else DEFAULT_BATCH_SIZE,
        "probe_budget_s": SMOKE_PROBE_BUDGET_S if args.smoke else DEFAULT_PROBE_BUDGET_S,
    }
    for name, default in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    return args


__all__ = ["Plan", "Setup", "base_setup", "diagnose_and_plan", "plan_after", "run_study"]
