"""The Lightning side of a trial's round: the Trainer readied for it (a PerfCallback, progress, the round's loss,
no checkpoints), the run's summary checked, the torch flags restored.

A round of a command (``tune/trial -- COMMAND`` and ``--config``, whose command is our Lightning CLI entry) uses
:func:`prepare_trainer` and :func:`finish_run` inside the command (:mod:`lightning_perf.trial.project.inject`);
:func:`fit_variant` fits a variant built in code in this process for :func:`lightning_perf.trial.api.run_trial`.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from typing_extensions import override

from lightning_perf import console
from lightning_perf.analysis.summary import SUMMARY_FILENAME
from lightning_perf.callback import PerfCallback
from lightning_perf.collect import namespaces
from lightning_perf.trial.compute.loss import RoundLoss

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
