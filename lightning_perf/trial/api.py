"""The before/after experiment, run for the user: each variant a short fit, then the comparison.

:func:`run_trial` fits variants built in code, in this process::

    run_trial([Variant("baseline", make_model, make_data),
               Variant("workers4", make_model, lambda: make_data(num_workers=4))], steps=40)

:func:`run_cli_trial` runs variants of a Lightning CLI config, each in its own process (``lightning-perf
trial``), so a crash, a hang or a global flag set by one variant cannot touch the others. Each variant is
logged as its own TensorBoard run ``<log dir>/<experiment>/<variant>``; the variants that ran are compared
against the first of them, written into TensorBoard as ``<experiment>/perf_compare`` and saved as
``<experiment>/comparison.json``. Lightning is imported only by the worker (and :func:`run_trial`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence

from lightning_perf.analysis.comparison import CompareError, compare
from lightning_perf.analysis.comparison_render import to_json
from lightning_perf.analysis.run_discovery import load_summary
from lightning_perf.analysis.summary import SummaryError
from lightning_perf.output.comparison_chart import TENSORBOARD_SUBDIR, write_tensorboard
from lightning_perf.trial.runner import describe_error, run_worker, worker_env
from lightning_perf.trial.spec import (
    COMPARISON_FILENAME,
    DEFAULT_LOG_DIR,
    WORKER_LOG_FILENAME,
    WORKER_MODULE,
    TrialError,
    TrialResult,
    Variant,
    VariantResult,
    check_name,
    check_steps,
    check_variant_names,
    prepare_experiment,
)


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


def run_cli_trial(
    configs: Sequence[str],
    variants: Sequence[tuple[str, list[tuple[str, str]]]],
    steps: int,
    log_dir: str,
    name: str,
    timeout_s: float | None = None,
) -> TrialResult:
    """Run each variant (a name and its config overrides) of the Lightning CLI ``configs`` in its own process."""
    experiment_dir = os.path.join(log_dir, name)
    reporter = Progress(len(variants))
    result = TrialResult(name, experiment_dir, steps, [])
    env = worker_env()
    for index, (variant, overrides) in enumerate(variants, start=1):
        outcome = VariantResult(variant, os.path.join(experiment_dir, variant), overrides=overrides)
        result.variants.append(outcome)
        os.makedirs(outcome.run_dir, exist_ok=True)
        outcome.log_path = os.path.join(outcome.run_dir, WORKER_LOG_FILENAME)
        spec = {
            "configs": list(configs),
            "overrides": overrides,
            "steps": steps,
            "log_dir": log_dir,
            "experiment": name,
            "variant": variant,
        }
        reporter.start(index, variant, steps)
        started = time.perf_counter()
        error = run_worker(
            [sys.executable, "-m", WORKER_MODULE],
            json.dumps(spec),
            outcome.log_path,
            timeout_s=timeout_s,
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


__all__ = ["TrialError", "TrialResult", "Variant", "VariantResult", "run_cli_trial", "run_trial"]
