"""The before/after experiment, run for the user like a benchmark tool: repeated, interleaved rounds of short
fits, then the comparison with intervals.

:func:`run_trial` fits variants built in code, in this process::

    result = run_trial([Variant("baseline", make_model, make_data),
                        Variant("workers4", make_model, lambda: make_data(num_workers=4))], steps=40)
    change = result.comparison.changes["workers4"]  # the mean step time's MetricChange against the first
    change.verdict, change.factor, change.factor_low, change.factor_high  # "faster", 1.64, 1.56, 1.72

:func:`run_command_trial` runs variants of a training command (``lightning-perf trial -- COMMAND``, or the
command of a Lightning CLI config, ``trial --config``), each round in its own process, so a crash, a hang or a
global flag set by one variant cannot touch the others. The variants run in
rounds, A B C A B C ..., so a drift of the machine hits all alike; each round is logged as its own TensorBoard
run ``<log dir>/<experiment>/<variant>/round_<i>`` (``<variant>`` alone with one round); the order within a
round rotates (A B C, B C A, ...), so whatever the first run of a round pays falls on each variant in turn. The variants that ran
are compared against the first of them over the per-round ratios, written into TensorBoard as
``<experiment>/perf_compare`` and saved as ``<experiment>/comparison.json``. Lightning is imported only by the
command's rounds (and :func:`run_trial`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any

from lightning_perf.analysis.run_discovery import load_hparams
from lightning_perf.analysis.verdicts.comparison import CompareError, compare
from lightning_perf.analysis.verdicts.comparison_render import to_json
from lightning_perf.atomic_file import atomic_open
from lightning_perf.output.comparison_chart import TENSORBOARD_SUBDIR, write_tensorboard
from lightning_perf.trial.progress import Progress
from lightning_perf.trial.rounds import _run_rounds
from lightning_perf.trial.runner import RoundLimits, RoundReport, describe_error
from lightning_perf.trial.spec import (
    COMPARISON_FILENAME,
    DEFAULT_LOG_DIR,
    DEFAULT_REPEATS,
    DEFAULT_WARMUP_STEPS,
    WORKER_LOG_FILENAME,
    TrialError,
    TrialResult,
    Variant,
    VariantResult,
    check_count,
    check_name,
    check_steps,
    check_variant_names,
    prepare_experiment,
    times_nothing,
)


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
    sizes = {v.name: v.summary.settings.batch_size for v in ran if v.summary is not None}
    if len({size for size in sizes.values() if size is not None}) > 1:
        result.batch_sizes = {name: size for name, size in sizes.items() if size is not None}
    rounds = [v.rounds for v in ran] if result.repeats > 1 else None
    # variants differ by definition (overrides, code): equal fingerprints do not mean "same settings"
    hparams = [load_hparams(v.round_dirs[0]) if v.round_dirs else None for v in ran]  # the same every round
    result.comparison = compare(
        summaries, [v.name for v in ran], rounds=rounds, variants_differ=True, hparams=hparams
    )
    path = os.path.join(result.experiment_dir, COMPARISON_FILENAME)
    try:
        with atomic_open(path) as fh:
            json.dump(to_json(result.comparison), fh, indent=2, allow_nan=False)
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


def run_trial(
    variants: Sequence[Variant],
    steps: int,
    log_dir: str = DEFAULT_LOG_DIR,
    name: str = "trial",
    progress: bool = True,
    overwrite: bool = False,
    repeats: int = DEFAULT_REPEATS,
    warmup_steps: int = DEFAULT_WARMUP_STEPS,
) -> TrialResult:
    """Fit each variant ``repeats`` times in interleaved rounds (A B, B A, ...), in this process, then compare.

    Every round fits ``warmup_steps + steps`` steps with a PerfCallback; the warm-up steps are left out of the
    figures. Each round is logged as the TensorBoard run ``<log_dir>/<name>/<variant>/round_<i>``
    (``<variant>`` alone with one round); the comparison is written as in ``lightning-perf trial``. A variant
    that raises is reported (``result.failed``) and the others go on. Global torch flags a variant's Trainer
    sets (``torch.backends.cudnn.benchmark`` and ``deterministic``, deterministic algorithms, float32 matmul
    precision) are restored after it.

    Args:
        variants: what to compare, the first the baseline; unique names.
        steps: the timed steps of each round (at least 1).
        log_dir: the folder the trial's folder ``<log_dir>/<name>`` goes in.
        name: the trial's name, a folder name.
        progress: a progress bar on stderr and the report on stdout.
        overwrite: replace an earlier trial of the same name (else it is an error).
        repeats: the rounds, at least 1; variants are compared over the per-round ratios, paired by round.
        warmup_steps: steps fitted before the timed ones in every round, left out of the figures.

    Returns:
        The trial: every variant's rounds and status, and ``comparison`` (each variant's mean step time against
        the first's, with an interval and a verdict) when two or more ran.

    Raises:
        TrialError: bad arguments (checked before anything runs) or an earlier trial in the way.
    """
    check_steps(steps, "steps")
    check_count(repeats, "repeats", 1)
    check_count(warmup_steps, "warmup_steps", 0)
    check_name(name, "name")
    check_variant_names([v.name for v in variants], "variants")
    for v in variants:
        if not callable(v.make_model) or not callable(v.make_data):
            raise TrialError(f"variant {v.name!r}: make_model and make_data must be callables")
        owned = sorted({"max_steps", "logger"} & set(v.trainer_kwargs))
        if owned:
            raise TrialError(f"variant {v.name!r}: trainer_kwargs {', '.join(owned)} are set by the trial")
        for key, value in v.trainer_kwargs.items():
            why = times_nothing(key, value)
            if why is not None:
                raise TrialError(f"variant {v.name!r}: trainer_kwargs {key}={value!r} {why}")
    experiment_dir = os.path.join(log_dir, name)
    prepare_experiment(experiment_dir, [v.name for v in variants], overwrite, cli=False)

    from lightning_perf.trial.worker import fit_variant, restored_torch_flags

    by_name = {v.name: v for v in variants}

    def run_one(outcome: VariantResult, version: str, run_dir: str, reporter: Progress) -> str | None:
        try:
            with restored_torch_flags():
                fit_variant(
                    by_name[outcome.name], steps + warmup_steps, log_dir, name, reporter.step, version
                )
        except Exception as err:
            return describe_error(err)
        return None

    result = TrialResult(name, experiment_dir, steps, [], repeats=repeats, warmup_steps=warmup_steps)
    outcomes = [VariantResult(v.name, os.path.join(experiment_dir, v.name)) for v in variants]
    _run_rounds(result, outcomes, run_one, progress)
    conclude(result)
    if progress:
        print(result.render(), end="", flush=True)
    return result


def run_command_trial(
    command: Sequence[str],
    variants: Sequence[tuple[str, list[tuple[str, str]]]],
    steps: int,
    log_dir: str,
    name: str,
    timeout_s: float | None = None,
    repeats: int = DEFAULT_REPEATS,
    warmup_steps: int = DEFAULT_WARMUP_STEPS,
    limits: RoundLimits | None = None,
    config_keys: bool = False,
) -> TrialResult:
    """Run each variant (a name and its settings in tune's names, e.g. ``[("num_workers", "4")]``) of the user's
    own training ``command``, ``repeats`` rounds interleaved, each round in its own process: the settings are
    applied inside the command at run time (:mod:`lightning_perf.trial.project.command`). A config's command
    (:func:`~lightning_perf.trial.project.command.config_command`, ``config_keys``) also takes config keys
    (``data.init_args.batch_size=8``), given to its CLI after the config.

    ``limits`` bound the rounds (shared by them all): ``timeout_s`` a round, else a limit derived from the
    expected round time; a budget stops the rounds at the last one run in full (a note says so). Without
    ``limits``, ``RoundLimits(timeout_s=timeout_s)``. SIGTERM or SIGHUP during a round end its process group and
    raise :class:`~lightning_perf.trial.runner.Terminated`; the rounds done stay on disk.
    """
    from lightning_perf.trial.project.command import run_command_round, split_overrides, write_bootstrap

    site = write_bootstrap(os.path.join(log_dir, name))
    split = {
        variant: split_overrides(variant, overrides, "--variant", config_keys)
        for variant, overrides in variants
    }

    def start(outcome: VariantResult, version: str, log_path: str, **round_args: Any) -> str | None:
        settings, arguments = split[outcome.name]
        spec = {
            "steps": steps + warmup_steps,
            "log_dir": log_dir,
            "experiment": name,
            "version": version,
            "settings": settings,
        }
        return run_command_round([*command, *arguments], site, spec, log_path, **round_args)

    return _run_in_processes(variants, start, steps, log_dir, name, repeats, warmup_steps, limits, timeout_s)


def _run_in_processes(
    variants: Sequence[tuple[str, list[tuple[str, str]]]],
    start: Callable[..., str | None],
    steps: int,
    log_dir: str,
    name: str,
    repeats: int,
    warmup_steps: int,
    limits: RoundLimits | None,
    timeout_s: float | None,
) -> TrialResult:
    """The rounds of process-run variants: ``start(outcome, version, log_path, **round_args)`` runs one."""
    experiment_dir = os.path.join(log_dir, name)
    limits = limits or RoundLimits(timeout_s=timeout_s)

    def run_one(outcome: VariantResult, version: str, run_dir: str, reporter: Progress) -> str | None:
        os.makedirs(run_dir, exist_ok=True)
        outcome.log_path = os.path.join(run_dir, WORKER_LOG_FILENAME)
        round_report = RoundReport()
        outcome.round_reports.append(round_report)
        return start(
            outcome,
            version,
            outcome.log_path,
            on_progress=reporter.step,
            limits=limits,  # shared, not a copy: the first finished round sets the expected round time
            report=round_report,
            on_limit=reporter.limit,
        )

    result = TrialResult(name, experiment_dir, steps, [], repeats=repeats, warmup_steps=warmup_steps)
    outcomes = [
        VariantResult(variant, os.path.join(experiment_dir, variant), overrides=overrides)
        for variant, overrides in variants
    ]
    _run_rounds(result, outcomes, run_one, progress=True, limits=limits)
    return conclude(result)


__all__ = [
    "TrialError",
    "TrialResult",
    "Variant",
    "VariantResult",
    "run_command_trial",
    "run_trial",
]
