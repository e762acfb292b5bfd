"""``lightning-perf trial``: the before/after experiment, run for the user.

Example::

    lightning-perf trial --config config.yaml --steps 40 --variant baseline \\
        --variant workers4:data.init_args.num_workers=4 --variant cudnn:trainer.benchmark=true

Each variant is a short ``fit`` of the Lightning CLI config (model and data given by ``class_path``) with the
variant's overrides and a PerfCallback. It runs in its own process, so a crash, a hang (``--timeout-s``) or a
global flag set by one variant cannot touch the others, and is logged as its own TensorBoard run
``<log dir>/<experiment>/<variant>``. Then the variants that ran are compared against the first of them: the
table is printed, written into TensorBoard as the run ``<experiment>/perf_compare`` and saved as
``<experiment>/comparison.json``. Progress goes to stderr, so ``--format json`` keeps stdout machine-readable.

For models built in code rather than a CLI config, :func:`run_trial` does the same in-process::

    run_trial([Variant("baseline", make_model, make_data),
               Variant("workers4", make_model, lambda: make_data(num_workers=4))], steps=40)

Exit codes: 0 every variant ran; 1 a variant failed, fewer than two could be compared, or one is slower than
``--fail-if-slower`` allows; 2 bad arguments; 130 interrupted. Lightning is imported only by the worker (and :func:`run_trial`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lightning_perf.analysis.comparison import Comparison, compare, render_markdown, render_text, to_json
from lightning_perf.analysis.summary import SUMMARY_FILENAME, RunSummary, SummaryError
from lightning_perf.cli.compare import (
    TENSORBOARD_SUBDIR,
    CompareError,
    gate,
    load_summary,
    write_tensorboard,
)
from lightning_perf.trial.runner import describe_error, run_worker, worker_env

if TYPE_CHECKING:
    from lightning.pytorch import LightningDataModule, LightningModule
    from torch.utils.data import DataLoader

HELP = "Run the before/after experiment: a short fit per variant of a Lightning CLI config, then compare."

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130  # the shell's code for a command stopped by Ctrl-C (128 + SIGINT)

DEFAULT_LOG_DIR = "perf_logs"
COMPARISON_FILENAME = "comparison.json"
WORKER_LOG_FILENAME = "trial_worker.log"
WORKER_MODULE = "lightning_perf.trial.worker"
TRIAL_SCHEMA_NAME = "lightning-perf/trial"
TRIAL_SCHEMA_VERSION = 1

# The first batch of an epoch is timed apart (iterator and worker start-up), so one step times nothing.
MIN_STEPS = 2
# Names become directories and TensorBoard runs: letters, digits and _.- only, not starting with a dot.
NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
KEY_PATTERN = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
# "a=1,b.c=[1,2]" splits only at commas followed by "key=", so values may hold commas (lists, dicts)
OVERRIDE_SPLIT = re.compile(rf",(?={KEY_PATTERN}=)")
# settings the trial owns: the step budget and where each run is logged
RESERVED_KEYS = ("trainer.max_steps", "trainer.logger")


class TrialError(ValueError):
    """Bad arguments for a trial; the message names the flag (CLI) or parameter (API). Exit code 2."""


# ----------------------------------------------------------------------------------------------- results


@dataclass
class VariantResult:
    """How one variant went. ``summary`` is its loaded run summary when it ran (``status == "ok"``)."""

    name: str
    run_dir: str
    status: str = "pending"  # "ok" or "failed"
    error: str | None = None
    wall_s: float = 0.0
    summary: RunSummary | None = None
    overrides: list[tuple[str, str]] = field(default_factory=list)
    log_path: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def summary_path(self) -> str | None:
        return os.path.join(self.run_dir, SUMMARY_FILENAME) if self.ok else None

    @property
    def median_step_ms(self) -> float | None:
        dist = self.summary.timing.step_time_ms if self.summary is not None else None
        return dist.median if dist is not None else None


@dataclass
class TrialResult:
    """The whole trial: every variant in the order requested, and the comparison of those that ran."""

    name: str
    experiment_dir: str
    steps: int
    variants: list[VariantResult]
    comparison: Comparison | None = None
    comparison_path: str | None = None
    tensorboard_dir: str | None = None
    # one line each: a baseline that failed, too few runs to compare, outputs that could not be written
    notes: list[str] = field(default_factory=list)

    @property
    def succeeded(self) -> list[VariantResult]:
        return [v for v in self.variants if v.ok]

    @property
    def failed(self) -> list[VariantResult]:
        return [v for v in self.variants if not v.ok]

    def render(self, fmt: str = "text") -> str:
        """The report: notes, the comparison table and the failed variants (``text`` or ``markdown``)."""
        markdown = fmt == "markdown"
        lines = [f"> note: {n}" if markdown else f"note: {n}" for n in self.notes]
        if lines:
            lines.append("")
        text = "\n".join(lines)
        if self.comparison is not None:
            text += render_markdown(self.comparison) if markdown else render_text(self.comparison)
        if self.failed:
            title = "**Failed variants (not compared):**" if markdown else "failed variants (not compared):"
            rows = [title]
            for v in self.failed:
                log = f" (log: {v.log_path})" if v.log_path else ""
                rows.append(f"- `{v.name}`: {v.error}{log}" if markdown else f"  {v.name}: {v.error}{log}")
            text += ("\n" if text else "") + "\n".join(rows) + "\n"
        return text

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: every variant's status and error, and the comparison (``compare.to_json``)."""
        return {
            "schema": TRIAL_SCHEMA_NAME,
            "schema_version": TRIAL_SCHEMA_VERSION,
            "name": self.name,
            "experiment_dir": self.experiment_dir,
            "steps": self.steps,
            "variants": [
                {
                    "name": v.name,
                    "status": v.status,
                    "error": v.error,
                    "run_dir": v.run_dir,
                    "summary_path": v.summary_path,
                    "log_path": v.log_path,
                    "wall_s": v.wall_s,
                    "median_step_ms": v.median_step_ms,
                    "overrides": {key: value for key, value in v.overrides},
                }
                for v in self.variants
            ],
            "notes": list(self.notes),
            "comparison": to_json(self.comparison) if self.comparison is not None else None,
            "comparison_path": self.comparison_path,
            "tensorboard_dir": self.tensorboard_dir,
        }


# ----------------------------------------------------------------------------------------------- validation


def check_steps(steps: Any, label: str) -> int:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < MIN_STEPS:
        raise TrialError(
            f"{label} must be an integer >= {MIN_STEPS} (the first step of a run is timed apart, as start-up), "
            f"got {steps!r}"
        )
    return steps


def check_name(name: Any, label: str) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise TrialError(
            f"{label} {name!r}: a name may hold letters, digits and _ . - only (it names a directory)"
        )
    return name


def check_variant_names(names: Sequence[str], label: str) -> None:
    if len(names) < 2:
        raise TrialError(f"{label}: give at least two variants (the first is the baseline), got {len(names)}")
    for name in names:
        check_name(name, label)
        if name in (TENSORBOARD_SUBDIR, COMPARISON_FILENAME):
            raise TrialError(f"{label} {name!r}: the name is reserved for the comparison's output")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise TrialError(f"{label}: variant names must be unique, repeated: {', '.join(duplicates)}")


def parse_variant(text: str) -> tuple[str, list[tuple[str, str]]]:
    """``"workers4:data.init_args.num_workers=4,trainer.benchmark=true"`` -> name and (key, value) overrides."""
    usage = "expected NAME or NAME:key=value[,key=value...], e.g. workers4:data.init_args.num_workers=4"
    name, sep, rest = text.partition(":")
    check_name(name, "--variant")
    if not sep:
        return name, []
    if not rest:
        raise TrialError(f"--variant {text!r}: no override after ':'; {usage}")
    overrides = []
    for item in OVERRIDE_SPLIT.split(rest):
        key, eq, value = item.partition("=")
        if not eq or not re.fullmatch(KEY_PATTERN, key):
            raise TrialError(f"--variant {text!r}: malformed override {item!r}; {usage}")
        if any(key == r or key.startswith(r + ".") for r in RESERVED_KEYS):
            raise TrialError(
                f"--variant {text!r}: {key} is set by the trial (--steps and --log-dir/--name); "
                "it cannot be overridden"
            )
        overrides.append((key, value))
    keys = [key for key, _ in overrides]
    if len(set(keys)) != len(keys):
        raise TrialError(f"--variant {text!r}: a key is given twice")
    return name, overrides


def check_configs(paths: Sequence[str]) -> None:
    """Each file exists and is a YAML mapping, and together they give a model (checked here, not per variant)."""
    import yaml

    keys: set[str] = set()
    for path in paths:
        if not os.path.isfile(path):
            raise TrialError(f"--config {path}: no such file")
        try:
            with open(path, encoding="utf-8") as fh:
                data = yaml.safe_load(fh)
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
            raise TrialError(f"--config {path}: cannot read it as YAML: {err}") from None
        if not isinstance(data, dict):
            raise TrialError(
                f"--config {path}: expected a YAML mapping (trainer/model/data), got {data!r:.80}"
            )
        keys.update(data)
    if "model" not in keys:
        raise TrialError(
            f"--config {', '.join(paths)}: no `model` given; the trial needs the model (and usually the data) "
            "given by class_path, as a Lightning CLI config"
        )


def prepare_experiment(experiment_dir: str, names: Sequence[str], overwrite: bool, cli: bool) -> None:
    """Refuse to mix a trial's runs with an earlier trial's (stale summaries), unless told to replace them."""
    existing = [n for n in names if os.path.exists(os.path.join(experiment_dir, n))]
    if existing and not overwrite:
        name, replace = ("--name", "pass --overwrite") if cli else ("name", "pass overwrite=True")
        raise TrialError(
            f"{name}: {experiment_dir} already holds runs named {', '.join(existing)} from an earlier trial; "
            f"choose another {name} or {replace} to replace them"
        )
    for name in existing:
        shutil.rmtree(os.path.join(experiment_dir, name))
    stale = os.path.join(experiment_dir, COMPARISON_FILENAME)
    if overwrite and os.path.exists(stale):
        os.remove(stale)


# ----------------------------------------------------------------------------------------------- progress


class Progress:
    """``[2/3] workers4: step 8/40`` lines on stderr (or nowhere when not enabled)."""

    def __init__(self, total: int, enabled: bool = True) -> None:
        self.total = total
        self.enabled = enabled
        self.prefix = ""

    def _say(self, text: str) -> None:
        if self.enabled:
            print(f"{self.prefix}{text}", file=sys.stderr, flush=True)

    def start(self, index: int, name: str, steps: int) -> None:
        self.prefix = f"[{index}/{self.total}] {name}: "
        self._say(f"running {steps} steps ...")

    def step(self, done: int, steps: int) -> None:
        self._say(f"step {done}/{steps}")

    def finished(self, result: VariantResult) -> None:
        if result.ok:
            median = result.median_step_ms
            detail = f" (median step {median:.1f} ms)" if median is not None else ""
            self._say(f"done in {result.wall_s:.1f} s{detail}")
        else:
            log = f" (log: {result.log_path})" if result.log_path else ""
            self._say(f"FAILED: {result.error}{log}")


# ----------------------------------------------------------------------------------------------- the trial


def _load_variant(result: VariantResult) -> None:
    """Mark a variant whose worker finished ok, after checking its summary (a run with no timed step fails)."""
    try:
        summary = load_summary(result.run_dir, allow_partial=True)
    except (CompareError, SummaryError) as err:
        result.status, result.error = "failed", str(err)
        return
    if summary.timing.steps == 0:
        result.status, result.error = "failed", f"no training step was timed (run status {summary.status!r})"
        return
    result.summary, result.status = summary, "ok"


def conclude(result: TrialResult) -> TrialResult:
    """Compare the variants that ran (against the first of them) and write comparison.json and TensorBoard."""
    ran = result.succeeded
    if len(ran) < 2:
        result.notes.append(
            f"fewer than two variants ran ({len(ran)} of {len(result.variants)}): there is nothing to compare"
        )
        return result
    requested = result.variants[0]
    if not requested.ok:
        result.notes.append(
            f"the baseline {requested.name!r} failed; comparing against {ran[0].name!r}, the first variant "
            "that ran"
        )
    summaries = [v.summary for v in ran if v.summary is not None]  # a variant that ran has its summary
    result.comparison = compare(summaries, [v.name for v in ran])
    path = os.path.join(result.experiment_dir, COMPARISON_FILENAME)
    try:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(to_json(result.comparison), fh, indent=2)
            fh.write("\n")
        result.comparison_path = path
    except OSError as err:
        result.notes.append(f"could not write {path}: {err.strerror or err}")
    directory = os.path.join(result.experiment_dir, TENSORBOARD_SUBDIR)
    try:
        write_tensorboard(result.comparison, directory)
        result.tensorboard_dir = directory
    except CompareError as err:
        result.notes.append(str(err))
    return result


@dataclass
class Variant:
    """One variant for :func:`run_trial`: how to build its model, data and Trainer.

    Args:
        name: the variant's name (its TensorBoard run); letters, digits and ``_.-``.
        make_model: returns a new LightningModule.
        make_data: returns a LightningDataModule or a training DataLoader.
        trainer_kwargs: extra ``Trainer`` arguments (e.g. ``{"benchmark": True}``); ``callbacks`` may hold a
            PerfCallback of your own, else one is added. ``max_steps`` and ``logger`` are the trial's.
        callback_kwargs: arguments of the PerfCallback the trial adds.
    """

    name: str
    make_model: Callable[[], LightningModule]
    make_data: Callable[[], LightningDataModule | DataLoader]
    trainer_kwargs: dict[str, Any] = field(default_factory=dict)
    callback_kwargs: dict[str, Any] = field(default_factory=dict)


def run_trial(
    variants: Sequence[Variant],
    steps: int,
    log_dir: str = DEFAULT_LOG_DIR,
    name: str = "trial",
    progress: bool = True,
    overwrite: bool = False,
) -> TrialResult:
    """Fit each variant for ``steps`` steps with a PerfCallback, in this process, then compare them.

    Each variant is logged as the TensorBoard run ``<log_dir>/<name>/<variant>``; the comparison is written as
    in ``lightning-perf trial``. A variant that raises is reported (``result.failed``) and the others go on.
    Global torch flags a variant's Trainer sets (``torch.backends.cudnn.benchmark`` and ``deterministic``,
    deterministic algorithms, float32 matmul precision) are restored after it, so the next variant starts
    from the same state. With ``progress``, progress lines go to stderr and the report to stdout.

    Raises:
        ValueError (``TrialError``): bad arguments, checked before anything runs.
    """
    check_steps(steps, "steps")
    check_name(name, "name")
    check_variant_names([v.name for v in variants], "variants")
    for v in variants:
        if not callable(v.make_model) or not callable(v.make_data):
            raise TrialError(f"variant {v.name!r}: make_model and make_data must be callables")
        owned = sorted({"max_steps", "logger"} & set(v.trainer_kwargs))
        if owned:
            raise TrialError(f"variant {v.name!r}: trainer_kwargs {', '.join(owned)} are set by the trial")
    experiment_dir = os.path.join(log_dir, name)
    prepare_experiment(experiment_dir, [v.name for v in variants], overwrite, cli=False)

    from lightning_perf.trial.worker import fit_variant, restored_torch_flags

    reporter = Progress(len(variants), progress)
    result = TrialResult(name, experiment_dir, steps, [])
    for index, variant in enumerate(variants, start=1):
        outcome = VariantResult(variant.name, os.path.join(experiment_dir, variant.name))
        result.variants.append(outcome)
        reporter.start(index, variant.name, steps)
        started = time.perf_counter()
        try:
            with restored_torch_flags():
                fit_variant(variant, steps, log_dir, name, reporter.step)
        except Exception as err:
            outcome.status, outcome.error = "failed", describe_error(err)
        else:
            _load_variant(outcome)
        outcome.wall_s = time.perf_counter() - started
        reporter.finished(outcome)
    conclude(result)
    if progress:
        print(result.render(), end="", flush=True)
    return result


# ----------------------------------------------------------------------------------------------- the command


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
    parser.add_argument(
        "--format", choices=("text", "markdown", "json"), default="text", help="output format (default: text)"
    )
    parser.add_argument(
        "--fail-if-slower",
        type=float,
        metavar="PCT",
        help="exit with code 1 when a variant's median step time is more than PCT percent above the baseline's",
    )
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
    except TrialError as err:
        print(f"lightning-perf trial: error: {err}", file=sys.stderr)
        return EXIT_ERROR
    try:
        result = _run_cli_trial(args, variants)
    except KeyboardInterrupt:  # the running worker was stopped; no comparison of a half-done trial
        print("lightning-perf trial: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED

    if args.format == "json":
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(result.render(args.format), end="")
    for path in (result.comparison_path, result.tensorboard_dir):
        if path:
            print(f"lightning-perf trial: wrote {path}", file=sys.stderr)

    code = EXIT_OK if not result.failed and result.comparison is not None else EXIT_FAILED
    if args.fail_if_slower is not None and result.comparison is not None:
        try:
            code = max(code, gate(result.comparison, args.fail_if_slower, prog="lightning-perf trial"))
        except CompareError as err:
            print(f"lightning-perf trial: {err}", file=sys.stderr)
            code = EXIT_FAILED
    return code


def _check_args(args: argparse.Namespace) -> list[tuple[str, list[tuple[str, str]]]]:
    check_steps(args.steps, "--steps")
    if args.fail_if_slower is not None and not (
        math.isfinite(args.fail_if_slower) and args.fail_if_slower >= 0
    ):
        raise TrialError(f"--fail-if-slower must be a percentage >= 0, got {args.fail_if_slower:g}")
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


def _run_cli_trial(
    args: argparse.Namespace, variants: list[tuple[str, list[tuple[str, str]]]]
) -> TrialResult:
    experiment_dir = os.path.join(args.log_dir, args.name)
    reporter = Progress(len(variants))
    result = TrialResult(args.name, experiment_dir, args.steps, [])
    env = worker_env()
    for index, (name, overrides) in enumerate(variants, start=1):
        outcome = VariantResult(name, os.path.join(experiment_dir, name), overrides=overrides)
        result.variants.append(outcome)
        os.makedirs(outcome.run_dir, exist_ok=True)
        outcome.log_path = os.path.join(outcome.run_dir, WORKER_LOG_FILENAME)
        spec = {
            "configs": list(args.config),
            "overrides": overrides,
            "steps": args.steps,
            "log_dir": args.log_dir,
            "experiment": args.name,
            "variant": name,
        }
        reporter.start(index, name, args.steps)
        started = time.perf_counter()
        error = run_worker(
            [sys.executable, "-m", WORKER_MODULE],
            json.dumps(spec),
            outcome.log_path,
            timeout_s=args.timeout_s,
            on_progress=reporter.step,
            env=env,
        )
        outcome.wall_s = time.perf_counter() - started
        if error is None:
            _load_variant(outcome)
        else:
            outcome.status, outcome.error = "failed", error
        reporter.finished(outcome)
    return conclude(result)
