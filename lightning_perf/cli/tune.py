"""``lightning-perf tune``: diagnose a Lightning project, measure the changes its findings ask for, and write the
fastest verified one in the project's terms (see :mod:`lightning_perf.tune.run`).

Examples::

    lightning-perf tune --config config.yaml --steps 20 --repeats 3 --budget-s 600
    lightning-perf tune -- python train.py data=mnist trainer.max_epochs=10     # a Hydra app
    lightning-perf tune -- python main.py fit --config config.yaml              # a LightningCLI script
    lightning-perf tune -- python train.py                                      # a plain script

Both ways run the same: the command runs as given (a config, as the command of our Lightning CLI entry built with
it, ``--cli`` naming how) and each round's settings are applied inside it at run time; the winner is found by the
values the run built and written where the project sets it: ``CFG.tuned.yaml`` beside the LightningCLI config it
ran with (under the key that fed the DataLoader, e.g. a datamodule's ``workers``), Hydra overrides and a tuned
config group file, or the file and line that builds the DataLoader or Trainer.

Before any fit, tune refuses (exit code 2, naming what): a ``CFG.tuned.yaml`` already there (pass
``--overwrite`` to replace it), a config folder that cannot take it (its path and errno), a setting of the config
or of a ``--variant`` that times no step (``trainer.fast_dev_run``, ``trainer.limit_train_batches: 0``...), and a
``--variant`` that changes the batch size without ``--allow-semantic-changes``. Variants of different batch
sizes are judged on samples a second, not step time.

Exit codes: 0 a verdict (a tuned config, or keep your config); 1 no verdict (the diagnosis or the baseline
failed, or the budget is too small), or the tuned config chosen could not be written; 2 bad arguments;
130 interrupted, 143 (SIGTERM) or 129 (SIGHUP) terminated (the rounds done stay in the log dir). The budget
bounds every fit: a round it stops is dropped and the rounds run in full are kept, with a note.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from lightning_perf.cli.common import EXIT_FAILED, EXIT_OK, guard, runs_kept
from lightning_perf.trial.spec import (
    DEFAULT_LOG_DIR,
    DEFAULT_REPEATS,
    TrialError,
    check_count,
    check_name,
    check_steps,
    check_variant_names,
)
from lightning_perf.tune.project import project_of
from lightning_perf.tune.run import BASELINE, DEFAULT_BUDGET_S, DEFAULT_STEPS, DIAGNOSIS, EXAMPLE, run_tune
from lightning_perf.tune.variants import VariantArg, parse_variant

HELP = "Diagnose a Lightning project (a CLI config or your training command), measure the changes its findings ask for, write the fastest verified one."
PROG = "lightning-perf tune"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="CFG.yaml",
        help="the Lightning CLI config to tune (or give your training command after --: "
        "`lightning-perf tune -- python train.py ARGS...`)",
    )
    parser.add_argument(
        "--cli",
        metavar="MODULE:FUNCTION",
        help="how to build the CLI for a config with plain model:/data: sections, as for `trial` (a LightningCLI "
        "subclass given its classes where your script calls it: read from that call)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        metavar="N",
        help=f"timed training steps per variant and round (default: {DEFAULT_STEPS})",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=DEFAULT_REPEATS,
        metavar="R",
        help=f"interleaved rounds per variant, fewer when the budget is short (default: {DEFAULT_REPEATS})",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=DEFAULT_BUDGET_S,
        metavar="S",
        help=f"seconds for the whole tune, diagnosis included (default: {DEFAULT_BUDGET_S:g})",
    )
    parser.add_argument(
        "--allow-semantic-changes",
        action="store_true",
        help="also try changes that alter what is learned (batch size, a --variant's too; lower precision for a "
        "full-precision run); they are labelled so, and variants of different batch sizes are judged on samples "
        "a second",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing CFG.tuned.yaml (without it, tune refuses to start when one is there)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:key=value[,key=value...]",
        help="also measure this candidate of your own (repeat), e.g. workers8:num_workers=8 (settings: num_workers, "
        "persistent_workers, pin_memory, prefetch_factor, precision, benchmark, matmul_precision, compile, "
        "channels_last, fused_optimizer); with --config also config keys, e.g. "
        "bs16:data.init_args.batch_size=16",
    )
    parser.add_argument(
        "--format", choices=("text", "json"), default="text", help="output format (default: text)"
    )
    parser.add_argument(
        "--log-dir", default=DEFAULT_LOG_DIR, metavar="DIR", help=f"log root (default: {DEFAULT_LOG_DIR})"
    )
    parser.add_argument(
        "--name",
        metavar="EXPERIMENT",
        help="experiment folder (default: <config stem>_tune, then _tune_2, ...)",
    )


def run(args: argparse.Namespace) -> int:
    return guard(
        PROG, lambda: _run(args), kept=lambda: f"{runs_kept(args.log_dir)}; no tuned config was written"
    )


def _run(args: argparse.Namespace) -> int:
    extra = _check_args(args)
    result = run_tune(
        args.config,
        steps=args.steps,
        repeats=args.repeats,
        budget_s=args.budget_s,
        log_dir=args.log_dir,
        name=args.name,
        cli=args.cli,
        allow_semantic=args.allow_semantic_changes,
        extra=extra,
        overwrite=args.overwrite,
        command=args.user_command,
    )
    if args.format == "json":
        print(json.dumps(result.to_dict(), indent=2, allow_nan=False))
    else:
        print(result.render(), end="")
    if result.write_error:
        print(f"{PROG}: error: {result.write_error}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK if result.decision.judged else EXIT_FAILED


def _check_args(args: argparse.Namespace) -> list[VariantArg]:
    check_steps(args.steps, "--steps")
    check_count(args.repeats, "--repeats", 2)  # one round gives no interval, so no verdict
    if args.budget_s is not None and not (math.isfinite(args.budget_s) and args.budget_s > 0):
        raise TrialError(f"--budget-s must be a number of seconds > 0, got {args.budget_s:g}")
    variants = [parse_variant(text) for text in args.variant]
    for variant in variants:
        if not variant.overrides:
            raise TrialError(
                f"--variant {variant.name!r}: give its overrides, e.g. {variant.name}:data.init_args.num_workers=8"
            )
    check_variant_names([BASELINE, DIAGNOSIS, *(variant.name for variant in variants)], "--variant")
    args.user_command = getattr(args, "user_command", None)
    project_of(args.config, args.user_command, args.cli, EXAMPLE).preflight(variants)
    if args.name is not None:
        check_name(args.name, "--name")
        if os.path.exists(os.path.join(args.log_dir, args.name)):
            raise TrialError(
                f"--name: {os.path.join(args.log_dir, args.name)} already exists; choose another --name "
                "(or leave it out for a fresh one)"
            )
    return variants
