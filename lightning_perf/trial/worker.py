"""The Lightning side of ``lightning-perf trial``: fit one variant with a PerfCallback and report progress.

``python -m lightning_perf.trial.worker`` is started by :mod:`lightning_perf.trial.api` once per variant. It reads
a JSON spec on stdin (configs, overrides, steps, log dir, experiment, variant), builds the Lightning CLI from
it, fits, and prints protocol lines for the parent on stdout: ``pace K N`` (training began, the first step) and
``progress K N`` (the parent derives its time limit from them), ``disturbed TEXT`` when others used the machine
while it measured, then ``done`` or ``error MESSAGE``. On Linux it dies with the parent that started it.
:func:`fit_variant` does the same in-process for :func:`lightning_perf.trial.api.run_trial`.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import TensorBoardLogger
from typing_extensions import override

from lightning_perf import console
from lightning_perf.analysis.summary import SUMMARY_FILENAME, RunSummary
from lightning_perf.callback import PerfCallback
from lightning_perf.collect import namespaces
from lightning_perf.trial import targets
from lightning_perf.trial.compute.loss import RoundLoss
from lightning_perf.trial.parent_death import die_with_parent
from lightning_perf.trial.runner import describe_error, disturbance, protocol_line

if TYPE_CHECKING:
    from lightning_perf.trial.spec import Variant

Report = Callable[[int, int], None]

# Trainer settings of every variant (a variant may override them): a trial times training steps only, so
# validation, the progress bar and a Trainer profiler (it would slow the steps it shares with PerfCallback)
# are off; max_epochs=-1 lets max_steps alone end the run. Checkpoint callbacks are taken out of the Trainer.
TRIAL_TRAINER_DEFAULTS: dict[str, Any] = {
    "max_epochs": -1,
    "limit_val_batches": 0,
    "num_sanity_val_steps": 0,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "profiler": None,
}
log = console.logger(__name__)

# PerfCallback arguments when the trial adds the callback: no num_workers probe, the trial is the experiment
TRIAL_PERF_DEFAULTS: dict[str, Any] = {"probe_num_workers": "never"}
# the CLI's default seed (a config's seed_everything wins): every variant starts from the same weights and data
TRIAL_SEED = 0
# "step k/N" lines per variant: about one every 10% of the steps
PROGRESS_REPORTS = 10


# messages already printed in this process
_SAID: set[str] = set()


class TrialProgress(Callback):
    """Calls ``report(step, steps)`` about every 10% of the steps (``trainer.global_step``) and at the end, and
    ``pace(0, steps)`` as training begins and ``pace(step, steps)`` after the first step when ``report`` is not
    called there (the parent's time limit needs the start-up and the pace early)."""

    def __init__(self, steps: int, report: Report, pace: Report | None = None) -> None:
        super().__init__()
        self.steps = steps
        self.report = report
        self.pace = pace
        self.every = max(1, math.ceil(steps / PROGRESS_REPORTS))
        self.next_step: float = min(self.every, steps)
        self.paced = False

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.pace is not None:
            self.pace(0, self.steps)

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if self.pace is not None and not self.paced and step >= 1:
            self.paced = True
            if step < self.next_step:
                self.pace(step, self.steps)
        if step >= self.next_step:
            self.report(step, self.steps)
            # the next multiple of `every`, and the last step always
            self.next_step = (
                min((step // self.every + 1) * self.every, self.steps) if step < self.steps else math.inf
            )


def prepare_trainer(
    trainer: Trainer,
    steps: int,
    report: Report,
    perf_kwargs: dict[str, Any] | None = None,
    pace: Report | None = None,
) -> PerfCallback:
    """Ready a variant's Trainer: its PerfCallback (the user's, arguments kept, or a new one), the progress, the
    round's loss (:class:`RoundLoss`), and no checkpoint or early-stopping callback: a trial saves nothing and runs no validation to stop on."""
    # either namespace's (a command's round may build a pytorch_lightning Trainer)
    left_out = [
        cb
        for cb in trainer.callbacks
        if namespaces.is_instance(cb, "callbacks", "Checkpoint")
        or namespaces.is_instance(cb, "callbacks", "EarlyStopping")
    ]
    if left_out:
        names = ", ".join(type(cb).__name__ for cb in left_out)
        message = f"lightning-perf trial: callbacks left out (no checkpoints, no validation): {names}"
        if message not in _SAID:  # once a process, not once a round
            _SAID.add(message)
            log.info(message)
    callbacks = [cb for cb in trainer.callbacks if not any(cb is other for other in left_out)]
    perf = next((cb for cb in callbacks if isinstance(cb, PerfCallback)), None)
    if perf is None:
        perf = PerfCallback(**{**TRIAL_PERF_DEFAULTS, **(perf_kwargs or {})})
        callbacks.append(perf)
    elif perf_kwargs:
        raise ValueError("callback_kwargs are given but the callbacks already hold a PerfCallback; use one")
    trainer.callbacks = [*callbacks, TrialProgress(steps, report, pace), RoundLoss()]
    return perf


def finish_run(perf: PerfCallback, run_dir: str) -> str:
    """Check the run's summary and make sure ``<run_dir>/perf_summary.json`` holds it; returns that path."""
    summary = perf.last_summary
    if summary is None:
        raise RuntimeError("PerfCallback produced no run summary: did any training step run?")
    if summary.status != "finished":
        raise RuntimeError(f"the run ended with status {summary.status!r}")
    path = os.path.join(run_dir, SUMMARY_FILENAME)
    if not os.path.isfile(path):  # the user's PerfCallback writes elsewhere (dirpath): keep a copy here
        summary.save(path)
    return path


@contextlib.contextmanager
def restored_torch_flags() -> Iterator[None]:
    """Restore the global torch flags a Trainer sets (benchmark, deterministic, matmul precision) afterwards."""
    cudnn = torch.backends.cudnn
    saved = (
        cudnn.benchmark,
        cudnn.deterministic,
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.get_float32_matmul_precision(),
    )
    try:
        yield
    finally:
        cudnn.benchmark, cudnn.deterministic = saved[0], saved[1]
        torch.use_deterministic_algorithms(saved[2], warn_only=saved[3])
        torch.set_float32_matmul_precision(saved[4])


def fit_variant(
    variant: Variant, steps: int, log_dir: str, experiment: str, report: Report, version: str | None = None
) -> str:
    """Fit one :class:`~lightning_perf.trial.api.Variant` in this process (one round: the TensorBoard run
    ``version``, default the variant's name); returns its summary's path."""
    model = variant.make_model()
    data = variant.make_data()
    kwargs = {**TRIAL_TRAINER_DEFAULTS, **variant.trainer_kwargs}
    logger = TensorBoardLogger(save_dir=log_dir, name=experiment, version=version or variant.name)
    trainer = Trainer(logger=logger, max_steps=steps, **kwargs)
    perf = prepare_trainer(trainer, steps, report, variant.callback_kwargs)
    if isinstance(data, LightningDataModule):
        trainer.fit(model, datamodule=data)
    else:
        trainer.fit(model, train_dataloaders=data)
    return finish_run(perf, logger.log_dir)


# ----------------------------------------------------------------------------------------------- CLI worker


class _AcceptsCkptPath(LightningCLI):
    """Accepts the ``ckpt_path`` a config saved by ``fit`` holds (a trial starts fresh and ignores it)."""

    @override
    def add_arguments_to_parser(self, parser: Any) -> None:
        super().add_arguments_to_parser(parser)
        parser.add_argument(
            "--ckpt_path", type=str | None, default=None, help="ignored: a trial starts fresh"
        )


class TrialCLI(_AcceptsCkptPath):
    """The Lightning CLI without subcommands, accepting a config saved by ``fit`` (it holds ``ckpt_path``)."""


def cli_args(spec: dict[str, Any]) -> list[str]:
    """The CLI arguments of a variant: configs, trial defaults, the variant's overrides, then what the trial owns."""
    args = [arg for path in spec["configs"] for arg in ("--config", path)]
    args += [f"--trainer.{key}={json.dumps(value)}" for key, value in TRIAL_TRAINER_DEFAULTS.items()]
    args += [f"--{key}={value}" for key, value in spec["overrides"]]
    logger = {
        "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
        "init_args": {"save_dir": spec["log_dir"], "name": spec["experiment"], "version": run_version(spec)},
    }
    args += [f"--trainer.max_steps={int(spec['steps'])}", f"--trainer.logger={json.dumps(logger)}"]
    return args


def run_version(spec: dict[str, Any]) -> str:
    """The run's TensorBoard version: ``variant`` or ``variant/round_N`` (the spec's ``version``)."""
    return str(spec.get("version") or spec["variant"])


def resolve_cli(target: str | None) -> tuple[type[LightningCLI], dict[str, Any]]:
    """The CLI class and its model/data arguments for ``--cli module:attribute`` (None: class_path configs).

    The attribute may be a LightningCLI subclass (its own fixed classes), a LightningModule subclass, or a
    function returning either of those or ``(model class, datamodule class)``.
    """
    if target is None:
        return TrialCLI, {"subclass_mode_model": True, "subclass_mode_data": True}
    module_name, _, attribute = target.partition(":")
    found: Any = getattr(importlib.import_module(module_name), attribute)
    if not isinstance(found, type) and callable(found):
        found = found()
    if isinstance(found, type) and issubclass(found, LightningCLI):
        # the user's CLI with the trial's argument (ckpt_path of a saved config) added in front of it
        return type(f"Trial{found.__name__}", (_AcceptsCkptPath, found), {}), {}
    classes = found if isinstance(found, tuple) else (found, None)
    if (
        len(classes) != 2
        or not (isinstance(classes[0], type) and issubclass(classes[0], LightningModule))
        or not (
            classes[1] is None
            or (isinstance(classes[1], type) and issubclass(classes[1], LightningDataModule))
        )
    ):
        raise TypeError(
            f"--cli {target}: expected a LightningCLI subclass, a LightningModule class or (model class, "
            f"datamodule class), got {found!r:.120}"
        )
    return TrialCLI, {"model_class": classes[0], "datamodule_class": classes[1]}


def run_cli_variant(spec: dict[str, Any], report: Report, pace: Report | None = None) -> str:
    """Build the Lightning CLI for one variant and fit it; returns its summary's path."""
    cli_class, classes = resolve_cli(spec.get("cli"))
    try:
        cli = cli_class(
            args=cli_args(spec),
            run=False,
            save_config_callback=None,
            seed_everything_default=TRIAL_SEED,
            parser_kwargs={"exit_on_error": False},  # a bad override raises, so it is reported as the error
            **classes,
        )
    except (Exception, SystemExit) as err:
        if spec.get("cli") and not classes:  # the user's CLI subclass, whose classes its script gives
            raise ValueError(
                f"{describe_error(err)}; a LightningCLI subclass given its classes at the call site "
                "(MyCLI(MyModel, MyData) in main()) runs as its script does: `lightning-perf tune -- python "
                "main.py fit --config CFG.yaml` (or trial ... -- COMMAND)"
            ) from err
        raise
    if cli.config.get("ckpt_path"):
        log.info("lightning-perf trial: ignoring ckpt_path %s", cli.config["ckpt_path"])
    if spec.get("targets_path"):  # `tune`'s diagnosis: where the config can set each tunable setting
        targets.write(spec["targets_path"], cli.config, cli.model, cli.datamodule)
    own = any(isinstance(cb, PerfCallback) for cb in cli.trainer.callbacks)  # the user's arguments win
    perf = prepare_trainer(
        cli.trainer, int(spec["steps"]), report, None if own else spec.get("perf_kwargs"), pace
    )
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    run_dir = os.path.join(spec["log_dir"], spec["experiment"], run_version(spec))
    return finish_run(perf, run_dir)


def _say(kind: str, text: str = "") -> None:
    print(protocol_line(kind, text), flush=True)


def main() -> int:
    die_with_parent()
    try:
        spec = json.loads(sys.stdin.read())
        path = run_cli_variant(
            spec,
            lambda done, steps: _say("progress", f"{done} {steps}"),
            lambda done, steps: _say("pace", f"{done} {steps}"),
        )
    except (Exception, SystemExit) as err:
        traceback.print_exc()
        sys.stderr.flush()
        _say("error", describe_error(err))
        return 1
    try:
        disturbed = disturbance(RunSummary.load(path))
    except Exception:  # the parent reads the summary itself and reports what is wrong with it
        disturbed = None
    if disturbed:
        _say("disturbed", disturbed)
    _say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
