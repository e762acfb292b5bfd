"""``lightning-perf trial``: the before/after experiment on a Lightning CLI config or a training command (see
:mod:`lightning_perf.trial`).

Example::

    lightning-perf trial --config config.yaml --steps 40 --variant baseline \\
        --variant workers4:data.init_args.num_workers=4 --variant cudnn:trainer.benchmark=true

    lightning-perf trial --cli mypackage.train:MyCLI --config plain.yaml --steps 40 --repeats 5 \
        --variant baseline --variant workers4:data.num_workers=4 --png trial.png

    lightning-perf trial --steps 40 --variant baseline --variant workers4:num_workers=4 -- python train.py

With a command after ``--`` the command runs as given (a plain script, a Hydra app, a LightningCLI script) and
each variant's settings, in tune's names, are applied inside it at run time (:mod:`lightning_perf.trial.project.command`).
A config runs the same way, as the command of our Lightning CLI entry built with it
(:mod:`lightning_perf.trial.project.cli_main`): its variants take tune's names (``workers4:num_workers=4``) and
config keys (``data.init_args.num_workers=4``), given to the CLI after the config.

Each variant is a short ``fit`` with the variant's settings and a PerfCallback: for a config, model and data
given by ``class_path``, or plain ``model:``/``data:`` sections of a CLI with fixed classes named by
``--cli module:function``. The variants run ``--repeats`` times in interleaved rounds (A B, B A, ...),
each round in its own process, so a crash, a hang (``--timeout-s``) or a global flag set by one variant cannot
touch the others; ``--warmup-steps`` steps at the start of each round are left out. Each round is logged as
its own TensorBoard run ``<log dir>/<experiment>/<variant>/round_<i>``. Then the variants that ran are
compared against the first of them over the per-round ratios, with an interval and a verdict: the table is
printed, written into TensorBoard as the run ``<experiment>/perf_compare`` and saved as
``<experiment>/comparison.json``. A progress bar with its ETA goes to stderr, so ``--format json`` keeps
stdout machine-readable.


A setting of a config or a variant that times no step (``trainer.fast_dev_run``, ``trainer.limit_train_batches:
0``...) is refused before the first round, by name. Variants of different batch sizes get a note: compare their
samples a second, not their step times.

Exit codes: 0 every variant ran; 1 a variant failed, fewer than two could be compared, one is slower than
``--fail-if-slower`` allows (significantly), or an output (comparison.json, the chart) could not be written;
2 bad arguments; 130 interrupted; 143 (SIGTERM) or 129 (SIGHUP) terminated, the running worker and its
processes stopped first. Without ``--timeout-s`` a round is stopped at a limit derived from the expected round
time (10x, at least 120 s), so a hung round never waits forever. Lightning is imported only by the rounds'
processes (and :func:`run_trial`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from lightning_perf.analysis.verdicts.comparison import CompareError
from lightning_perf.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    add_fail_if_slower,
    add_format,
    gate,
    guard,
    runs_kept,
)
from lightning_perf.output.comparison_chart import write_png
from lightning_perf.trial.spec import (
    DEFAULT_LOG_DIR,
    DEFAULT_REPEATS,
    DEFAULT_WARMUP_STEPS,
    TrialError,
    check_count,
    check_name,
    check_steps,
    check_variant_names,
    prepare_experiment,
)
from lightning_perf.tune.project import Project, project_of
from lightning_perf.tune.variants import VariantArg, parse_variant

HELP = "Run the before/after experiment: a short fit per variant of a Lightning CLI config or your training command, then compare."
PROG = "lightning-perf trial"
EXAMPLE = "lightning-perf trial --steps 20 --variant base --variant w4:num_workers=4 -- python train.py"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        action="append",
        metavar="CFG.yaml",
        help="Lightning CLI config (repeat to merge several): model and data by class_path, or plain "
        "model:/data: sections with --cli",
    )
    parser.add_argument(
        "--cli",
        metavar="MODULE:FUNCTION",
        help="how to build the CLI for a config with plain model:/data: sections: a LightningCLI subclass (its "
        "classes read from where your script calls it), a LightningModule class, or a function returning one of "
        "them or (model class, datamodule class)",
    )
    parser.add_argument(
        "--steps", type=int, required=True, metavar="N", help="timed training steps per variant and round"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=DEFAULT_REPEATS,
        metavar="N",
        help=f"interleaved rounds per variant (default: {DEFAULT_REPEATS}); more rounds, narrower intervals",
    )
    parser.add_argument(
        "--warmup-steps",
        type=int,
        default=DEFAULT_WARMUP_STEPS,
        metavar="N",
        help=f"steps run before the timed ones in every round, left out (default: {DEFAULT_WARMUP_STEPS})",
    )
    parser.add_argument(
        "--variant",
        action="append",
        required=True,
        metavar="NAME[:key=value[,key=value...]]",
        help="a variant: a name and settings in tune's names, e.g. workers4:num_workers=4 (num_workers, "
        "persistent_workers, pin_memory, prefetch_factor, precision, benchmark, matmul_precision, compile, "
        "channels_last, fused_optimizer), with --config also config keys, e.g. bs8:data.init_args.batch_size=8; "
        "repeat; at least two; the first is the baseline",
    )
    parser.add_argument(
        "--log-dir", default=DEFAULT_LOG_DIR, metavar="DIR", help=f"log root (default: {DEFAULT_LOG_DIR})"
    )
    parser.add_argument(
        "--name",
        metavar="EXPERIMENT",
        help="experiment folder under the log root (default: the config's stem)",
    )
    add_format(parser)
    parser.add_argument("--png", metavar="FILE", help="also write a bar chart of the headline metrics")
    add_fail_if_slower(parser)
    parser.add_argument(
        "--timeout-s",
        type=float,
        metavar="S",
        help="stop a variant's round that runs longer than S seconds (default: 10x the expected round time, at "
        "least 120 s; the expected time is the first finished round's, or the round's own pace)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace runs of the same names left in the experiment folder by an earlier trial",
    )


def run(args: argparse.Namespace) -> int:
    return guard(PROG, lambda: _run(args), kept=lambda: runs_kept(args.log_dir))


def _run(args: argparse.Namespace) -> int:
    project, variants = _check_args(args)
    result = project.trial(
        variants,
        args.steps,
        args.log_dir,
        args.name,
        repeats=args.repeats,
        warmup_steps=args.warmup_steps,
        timeout_s=args.timeout_s,
    )
    if args.format == "json":
        print(json.dumps(result.to_dict(), indent=2, allow_nan=False))
    else:
        print(result.render(args.format), end="")
    png_failed = False
    if args.png and result.comparison is not None:
        try:
            write_png(result.comparison, args.png)
            print(f"lightning-perf trial: wrote chart {args.png}", file=sys.stderr)
        except CompareError as err:
            print(f"lightning-perf trial: {err}", file=sys.stderr)
            png_failed = True
    for path in (result.comparison_path, result.tensorboard_dir):
        if path:
            print(f"lightning-perf trial: wrote {path}", file=sys.stderr)

    code = EXIT_OK if not result.failed and result.comparison is not None else EXIT_FAILED
    if result.comparison is not None and (result.comparison_path is None or png_failed):
        code = EXIT_FAILED  # a promised output is missing (its note or error line says why)
    if args.fail_if_slower is not None and result.comparison is not None:
        try:
            code = max(code, gate(result.comparison, args.fail_if_slower, PROG))
        except CompareError as err:
            print(f"lightning-perf trial: {err}", file=sys.stderr)
            code = EXIT_FAILED
    return code


def _check_args(args: argparse.Namespace) -> tuple[Project, list[VariantArg]]:
    check_steps(args.steps, "--steps")
    check_count(args.repeats, "--repeats", 1)
    check_count(args.warmup_steps, "--warmup-steps", 0)
    if args.timeout_s is not None and not (math.isfinite(args.timeout_s) and args.timeout_s > 0):
        raise TrialError(f"--timeout-s must be a number of seconds > 0, got {args.timeout_s:g}")
    variants = [parse_variant(text) for text in args.variant]
    check_variant_names([variant.name for variant in variants], "--variant")
    project = project_of(args.config, getattr(args, "user_command", None), args.cli, EXAMPLE)
    project.preflight(variants)
    if args.name is None:
        args.name = project.stem()
    check_name(args.name, "--name")
    prepare_experiment(
        os.path.join(args.log_dir, args.name),
        [variant.name for variant in variants],
        args.overwrite,
        cli=True,
    )
    return project, variants
