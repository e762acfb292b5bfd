"""``lightning-perf trial``: the before/after experiment from a Lightning CLI config (see :mod:`lightning_perf.trial`).

Example::

    lightning-perf trial --config config.yaml --steps 40 --variant baseline \\
        --variant workers4:data.init_args.num_workers=4 --variant cudnn:trainer.benchmark=true

Each variant is a short ``fit`` of the Lightning CLI config (model and data given by ``class_path``) with the
variant's overrides and a PerfCallback. It runs in its own process, so a crash, a hang (``--timeout-s``) or a
global flag set by one variant cannot touch the others, and is logged as its own TensorBoard run
``<log dir>/<experiment>/<variant>``. Then the variants that ran are compared against the first of them: the
table is printed, written into TensorBoard as the run ``<experiment>/perf_compare`` and saved as
``<experiment>/comparison.json``. Progress goes to stderr, so ``--format json`` keeps stdout machine-readable.


Exit codes: 0 every variant ran; 1 a variant failed, fewer than two could be compared, or one is slower than
``--fail-if-slower`` allows; 2 bad arguments; 130 interrupted. Lightning is imported only by the worker (and :func:`run_trial`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from lightning_perf.analysis.comparison import CompareError
from lightning_perf.cli.common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    add_fail_if_slower,
    add_format,
    error,
    gate,
)
from lightning_perf.trial.api import run_cli_trial
from lightning_perf.trial.spec import (
    DEFAULT_LOG_DIR,
    TrialError,
    check_configs,
    check_name,
    check_steps,
    check_variant_names,
    parse_variant,
    prepare_experiment,
)

HELP = "Run the before/after experiment: a short fit per variant of a Lightning CLI config, then compare."
PROG = "lightning-perf trial"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        action="append",
        required=True,
        metavar="CFG.yaml",
        help="Lightning CLI config with model and data given by class_path (repeat to merge several)",
    )
    parser.add_argument("--steps", type=int, required=True, metavar="N", help="training steps per variant")
    parser.add_argument(
        "--variant",
        action="append",
        required=True,
        metavar="NAME[:key=value[,key=value...]]",
        help="a variant: a name and config overrides, e.g. workers4:data.init_args.num_workers=4 "
        "(repeat; at least two; the first is the baseline)",
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
    add_fail_if_slower(parser)
    parser.add_argument(
        "--timeout-s", type=float, metavar="S", help="stop a variant that runs longer than S seconds"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace runs of the same names left in the experiment folder by an earlier trial",
    )


def run(args: argparse.Namespace) -> int:
    try:
        variants = _check_args(args)
        result = run_cli_trial(args.config, variants, args.steps, args.log_dir, args.name, args.timeout_s)
    except (TrialError, OSError) as err:  # OSError: --log-dir is a file, unwritable, on a full disk
        return error(PROG, err)
    except KeyboardInterrupt:  # the running worker was stopped; no comparison of a half-done trial
        print("lightning-perf trial: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED

    if args.format == "json":
        print(json.dumps(result.to_dict(), indent=2, allow_nan=False))
    else:
        print(result.render(args.format), end="")
    for path in (result.comparison_path, result.tensorboard_dir):
        if path:
            print(f"lightning-perf trial: wrote {path}", file=sys.stderr)

    code = EXIT_OK if not result.failed and result.comparison is not None else EXIT_FAILED
    if args.fail_if_slower is not None and result.comparison is not None:
        try:
            code = max(code, gate(result.comparison, args.fail_if_slower, PROG))
        except CompareError as err:
            print(f"lightning-perf trial: {err}", file=sys.stderr)
            code = EXIT_FAILED
    return code


def _check_args(args: argparse.Namespace) -> list[tuple[str, list[tuple[str, str]]]]:
    check_steps(args.steps, "--steps")
    if args.timeout_s is not None and not (math.isfinite(args.timeout_s) and args.timeout_s > 0):
        raise TrialError(f"--timeout-s must be a number of seconds > 0, got {args.timeout_s:g}")
    variants = [parse_variant(text) for text in args.variant]
    check_variant_names([name for name, _ in variants], "--variant")
    check_configs(args.config)
    if args.name is None:
        args.name = os.path.splitext(os.path.basename(args.config[0]))[0]
    check_name(args.name, "--name")
    prepare_experiment(
        os.path.join(args.log_dir, args.name), [n for n, _ in variants], args.overwrite, cli=True
    )
    return variants
