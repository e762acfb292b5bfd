"""What a trial is made of: its variants, their results, and the checks on names, steps and overrides.

Pure data and validation; nothing here imports Lightning or starts a process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lightning_perf.analysis.numbers import whole
from lightning_perf.analysis.summary import SUMMARY_FILENAME, RunSummary
from lightning_perf.analysis.verdicts.comparison import Comparison
from lightning_perf.analysis.verdicts.comparison_render import to_json
from lightning_perf.atomic_file import describe_os_error, probe_write
from lightning_perf.errors import LightningPerfError
from lightning_perf.output.comparison_chart import TENSORBOARD_SUBDIR
from lightning_perf.trial.compute.figures import variant_figures
from lightning_perf.trial.rendering import disturbed_rounds, render_trial, trial_plan
from lightning_perf.yaml_budget import YamlBudgetError, load_yaml, load_yaml_file, shortened_repr

if TYPE_CHECKING:
    from lightning.pytorch import LightningDataModule, LightningModule
    from torch.utils.data import DataLoader

    from lightning_perf.trial.runner import RoundReport

DEFAULT_LOG_DIR = "perf_logs"
COMPARISON_FILENAME = "comparison.json"
WORKER_LOG_FILENAME = "trial_worker.log"
TRIAL_SCHEMA_NAME = "lightning-perf/trial"
TRIAL_SCHEMA_VERSION = 2
# Rounds per variant: three is the fewest whose per-round ratios give a t-interval at all useful (two rounds
# have one degree of freedom: t = 12.7); hyperfine and asv likewise default to several runs, never one.
DEFAULT_REPEATS = 3
# Steps timed but left out at the start of every round (allocator, caches, cudnn autotune, lazy init): our
# choice, on top of the first batch of each epoch, which is always timed apart as start-up.
DEFAULT_WARMUP_STEPS = 3
ROUND_DIR = "round_{}"

# The first batch of an epoch is timed apart (iterator and worker start-up), so one step times nothing.
MIN_STEPS = 2
# Names become directories and TensorBoard runs: letters, digits and _.- only, not starting with a dot.
NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
KEY_PATTERN = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"


class TrialError(LightningPerfError, ValueError):
    """Bad arguments for a trial; the message names the flag (CLI) or parameter (API). Exit code 2."""


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


@dataclass
class VariantResult:
    """How one variant went over its rounds.

    ``rounds`` holds each round's summary (warm-up steps left out) and ``summary`` all rounds pooled, when
    every round ran (``status == "ok"``); a variant whose round fails runs no further rounds.
    """

    name: str
    run_dir: str
    status: str = "pending"  # "ok" or "failed"
    error: str | None = None
    wall_s: float = 0.0
    summary: RunSummary | None = None
    overrides: list[tuple[str, str]] = field(default_factory=list)
    log_path: str | None = None
    rounds: list[RunSummary] = field(default_factory=list)
    round_dirs: list[str] = field(default_factory=list)
    # what the runner saw of each round run in a worker (its limit, a stop, a disturbance); to_dict keeps the
    # disturbed rounds only
    round_reports: list[RoundReport] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def summary_path(self) -> str | None:
        """The first round's ``perf_summary.json`` (the only one with a single round)."""
        return os.path.join(self.round_dirs[0], SUMMARY_FILENAME) if self.ok and self.round_dirs else None

    @property
    def mean_step_ms(self) -> float | None:
        """The mean step time over the variant's rounds pooled (warm-up left out): the compared figure."""
        dist = self.summary.timing.step_time_ms if self.summary is not None else None
        return dist.mean if dist is not None else None

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
    repeats: int = 1
    warmup_steps: int = 0
    comparison: Comparison | None = None
    comparison_path: str | None = None
    tensorboard_dir: str | None = None
    # one line each: a baseline that failed, too few runs to compare, outputs that could not be written
    notes: list[str] = field(default_factory=list)
    # the variants' batch sizes when they differ: a step holds a different number of samples (a note says so,
    # unless the comparison was made per sample, as tune's is)
    batch_sizes: dict[str, int] = field(default_factory=dict)
    judged_per_sample: bool = False

    @property
    def all_notes(self) -> list[str]:
        """The notes, with the one on differing batch sizes where the comparison was made per step."""
        if not self.batch_sizes or self.judged_per_sample:
            return list(self.notes)
        shown = ", ".join(f"{name} {size}" for name, size in self.batch_sizes.items())
        return [
            *self.notes,
            f"the variants differ in batch size ({shown}): a step holds a different number of samples, so compare "
            "them on samples a second (samples/s), not step time; a batch-size change also alters what is learned",
        ]

    @property
    def succeeded(self) -> list[VariantResult]:
        return [v for v in self.variants if v.ok]

    @property
    def failed(self) -> list[VariantResult]:
        return [v for v in self.variants if not v.ok]

    def render(self, fmt: str = "text") -> str:
        """The report: how it was measured, notes (disturbed rounds too), the comparison table, the failures."""
        return render_trial(self, fmt)

    def plan(self) -> str:
        return trial_plan(self)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: every variant's status and error, and the comparison (``compare.to_json``)."""
        return {
            "schema": TRIAL_SCHEMA_NAME,
            "schema_version": TRIAL_SCHEMA_VERSION,
            "name": self.name,
            "experiment_dir": self.experiment_dir,
            "steps": self.steps,
            "repeats": self.repeats,
            "warmup_steps": self.warmup_steps,
            "variants": [
                {
                    "name": v.name,
                    "status": v.status,
                    "error": v.error,
                    "run_dir": v.run_dir,
                    "summary_path": v.summary_path,
                    "round_dirs": list(v.round_dirs),
                    "log_path": v.log_path,
                    "wall_s": v.wall_s,
                    "mean_step_ms": v.mean_step_ms,
                    "median_step_ms": v.median_step_ms,
                    "overrides": {key: value for key, value in v.overrides},
                    "disturbed_rounds": [{"round": i, "line": text} for i, text in disturbed_rounds(v)],
                    "figures": variant_figures(v).to_dict() if v.ok else None,  # loss, compile time
                }
                for v in self.variants
            ],
            "notes": self.all_notes,
            "comparison": to_json(self.comparison) if self.comparison is not None else None,
            "comparison_path": self.comparison_path,
            "tensorboard_dir": self.tensorboard_dir,
        }


def check_steps(steps: Any, label: str) -> int:
    if whole(steps) is None or steps < MIN_STEPS:
        raise TrialError(
            f"{label} must be an integer >= {MIN_STEPS} (the first step of a run is timed apart, as start-up), "
            f"got {steps!r}"
        )
    return steps


def check_count(value: Any, label: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TrialError(f"{label} must be an integer >= {minimum}, got {value!r}")
    return value


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


def times_nothing(key: str, value: Any) -> str | None:
    """Why the Trainer setting ``key`` at ``value`` leaves a round with no timed step (``fast_dev_run: true``,
    ``limit_train_batches: 0``...), or None. An epoch's first batch is always timed apart, as start-up."""
    number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
    if key == "fast_dev_run" and (value is True or (isinstance(number, int) and number >= 1)):
        return "runs a few batches with the logger off, so no step is timed"
    if key == "limit_train_batches" and number == 0:
        return "runs no training batch"
    if key in ("limit_train_batches", "overfit_batches") and isinstance(number, int) and number == 1:
        return "makes epochs of one batch, and an epoch's first batch is timed apart as start-up: no step is timed"
    if key in ("max_steps", "max_epochs") and number == 0:
        return "trains nothing, so no step is timed"
    if key == "max_time" and (
        number == 0
        or (isinstance(value, str) and re.fullmatch(r"[0:]+", value.strip()))
        or (isinstance(value, dict) and not any(value.values()))
    ):
        return "stops the fit before its first step"
    return None


def check_timed_settings(
    configs: Sequence[str], variants: Sequence[tuple[str, list[tuple[str, str]]]]
) -> None:
    """Refuse, by name, a Trainer setting of the configs (the last to set it wins) or of a variant's overrides
    (values already checked as YAML) that times no step (:func:`times_nothing`): the rounds would measure nothing."""
    found: dict[str, tuple[str, Any]] = {}  # key -> (where, value)
    for path in configs:  # check_configs read them already: within the YAML node budget
        trainer = (load_yaml_file(path, f"--config {path}") or {}).get("trainer")
        for key, value in (trainer if isinstance(trainer, dict) else {}).items():
            found[key] = (f"--config {path}", value)
    # a config's value is written out only when refused: dumping every trainer setting would expand its aliases
    checks: list[tuple[str, str | None, str, Any, str]] = [
        (f"{where}:", None, key, value, "the config") for key, (where, value) in found.items()
    ]
    checks += [
        (
            f"--variant {name!r}:",
            f"{key}={text}",
            key.removeprefix("trainer."),
            load_yaml(text, f"--variant {name!r}: the value of {key}"),
            "the variant",
        )
        for name, overrides in variants
        for key, text in overrides
        if key.startswith("trainer.")
    ]
    for where, written, key, value, place in checks:
        why = times_nothing(key, value)
        if why is not None:  # small: times_nothing refuses scalars and an empty max_time only
            written = written or f"trainer.{key}: {json.dumps(value, default=str)}"
            raise TrialError(f"{where} {written} {why}; leave it out of {place} to measure it")


def check_log_dir(experiment_dir: str, label: str) -> None:
    """The experiment's folder can be created and written, checked before the first round (without creating it):
    its deepest existing part must be a writable directory."""
    existing = os.path.abspath(experiment_dir)
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise TrialError(
            f"{label}: {existing} is a file, not a directory (ENOTDIR); give a directory for the runs"
        )
    try:
        probe_write(existing)
    except OSError as err:
        raise TrialError(
            f"{label}: {existing} is not writable ({describe_os_error(err)}); give a directory you can write"
        ) from None


def check_configs(paths: Sequence[str], cli: str | None = None) -> None:
    """Each file exists and is a YAML mapping, and together they give a model (checked here, not per variant).

    Without ``cli`` (``--cli module:function``) the model must be given by ``class_path``: a plain ``model:``
    section belongs to a CLI built with fixed classes, which the trial must be told how to import.
    """
    import yaml

    keys: set[str] = set()
    plain_model = False
    for path in paths:
        if not os.path.isfile(path):
            raise TrialError(f"--config {path}: no such file")
        try:
            data = load_yaml_file(path, f"--config {path}")
        except YamlBudgetError as err:
            raise TrialError(str(err)) from None
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
            raise TrialError(f"--config {path}: cannot read it as YAML: {err}") from None
        if not isinstance(data, dict):
            raise TrialError(
                f"--config {path}: expected a YAML mapping (trainer/model/data), got {shortened_repr(data)}"
            )
        keys.update(data)
        model = data.get("model")
        if isinstance(model, dict) and "class_path" not in model:
            plain_model = True
        elif isinstance(model, dict):
            plain_model = False
    if cli is not None:
        check_cli_target(cli)
        return
    if plain_model:
        raise TrialError(
            f"--config {', '.join(paths)}: the `model:` section has no class_path, so it belongs to a CLI built "
            "with fixed classes, e.g. LightningCLI(MyModel, MyDataModule); tell the trial how to build it with "
            "--cli module:function (a LightningCLI subclass, or a function returning one or the model and "
            "datamodule classes)"
        )
    if "model" not in keys:
        raise TrialError(
            f"--config {', '.join(paths)}: no `model` given; the trial needs the model (and usually the data) "
            "given by class_path, as a Lightning CLI config"
        )


def check_cli_target(target: str) -> str:
    """``--cli`` names an importable object as ``module:attribute`` (imported by the worker, not here)."""
    module, sep, attribute = target.partition(":")
    if not sep or not re.fullmatch(KEY_PATTERN, module) or not re.fullmatch(KEY_PATTERN, attribute):
        raise TrialError(
            f"--cli {target!r}: expected module:function, e.g. mypackage.train:cli (a LightningCLI subclass, or "
            "a function returning one or the (model class, datamodule class))"
        )
    return target


def prepare_experiment(experiment_dir: str, names: Sequence[str], overwrite: bool, cli: bool) -> None:
    """Refuse to mix a trial's runs with an earlier trial's (stale summaries), unless told to replace them; refuse
    an experiment folder that cannot be written (a file, no permission) before any round starts."""
    check_log_dir(experiment_dir, "--log-dir/--name" if cli else "log_dir/name")
    existing = [n for n in names if os.path.exists(os.path.join(experiment_dir, n))]
    # a trial that never got to its comparison (it failed or was stopped) does not block its own rerun
    finished = os.path.exists(os.path.join(experiment_dir, COMPARISON_FILENAME))
    if existing and finished and not overwrite:
        name, replace = ("--name", "pass --overwrite") if cli else ("name", "pass overwrite=True")
        raise TrialError(
            f"{name}: {experiment_dir} already holds runs named {', '.join(existing)} from an earlier trial; "
            f"choose another {name} or {replace} to replace them"
        )
    for name in existing:
        shutil.rmtree(os.path.join(experiment_dir, name))
    stale = os.path.join(experiment_dir, COMPARISON_FILENAME)
    if (existing or overwrite) and os.path.exists(stale):
        os.remove(stale)
