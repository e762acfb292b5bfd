"""The step's anatomy: the time of a training step split into what the user wrote and what runs around it.

Lightning names every hook it calls (``[Callback]ModelCheckpoint.on_train_batch_end``,
``[LightningModule]Model.optimizer_step``, ``[Strategy]SingleDeviceStrategy.training_step``) when it asks its
profiler to time it; :mod:`lightning_perf.collect.steps.hook_profiler` times those calls (self time: a hook's
time less the hooks inside it) and the loggers' writes. This module turns the per-name seconds into the parts of
a step, per step: the batch's transfer, forward (``training_step``), ``zero_grad``, backward, the optimizer, the
LightningModule's own hooks, each callback, the progress bar, each logger, lightning-perf itself, and what is
left, Lightning's loop. Pure: no torch, no Lightning.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# the parts of a step, in the order a step runs them (data_wait is the DataLoader's, from the step clock)
DATA_WAIT = "data_wait"
TRANSFER = "transfer"
FORWARD = "forward"
ZERO_GRAD = "zero_grad"
BACKWARD = "backward"
OPTIMIZER = "optimizer"
MODULE_HOOKS = "module_hooks"
CALLBACKS = "callbacks"
PROGRESS_BAR = "progress_bar"
LOGGERS = "loggers"
LIGHTNING_PERF = "lightning_perf"
LOOP = "loop"
PARTS = (
    DATA_WAIT,
    TRANSFER,
    FORWARD,
    ZERO_GRAD,
    BACKWARD,
    OPTIMIZER,
    MODULE_HOOKS,
    CALLBACKS,
    PROGRESS_BAR,
    LOGGERS,
    LIGHTNING_PERF,
    LOOP,
)
# how each part is called where people read it
PART_LABELS = {
    DATA_WAIT: "DataLoader wait",
    TRANSFER: "batch transfer",
    FORWARD: "forward (training_step)",
    ZERO_GRAD: "zero_grad",
    BACKWARD: "backward",
    OPTIMIZER: "optimizer",
    MODULE_HOOKS: "LightningModule hooks",
    CALLBACKS: "callbacks",
    PROGRESS_BAR: "progress bar",
    LOGGERS: "loggers",
    LIGHTNING_PERF: "lightning-perf",
    LOOP: "Lightning's loop",
}

# the kinds of callback the hook profiler tells apart (by the callback's class, when it installs)
CALLBACK = "callback"
PROGRESS_BAR_KIND = "progress_bar"
OURS = "lightning_perf"

# the hooks a training step runs; the same callbacks' other hooks (validation, epoch ends, checkpoints) are not
# part of a step
STEP_HOOKS = frozenset(
    {
        "on_train_batch_start",
        "on_train_batch_end",
        "on_before_backward",
        "on_after_backward",
        "on_before_optimizer_step",
        "on_before_zero_grad",
        "on_before_batch_transfer",
        "on_after_batch_transfer",
        "transfer_batch_to_device",
        "batch_to_device",
        "training_step",
        "backward",
        "optimizer_step",
        "optimizer_zero_grad",
        "configure_gradient_clipping",
        "lr_scheduler_step",
        "log_metrics",
        "save",
    }
)
_TRANSFER_HOOKS = {
    "batch_to_device",
    "on_before_batch_transfer",
    "on_after_batch_transfer",
    "transfer_batch_to_device",
}
_OPTIMIZER_HOOKS = {"optimizer_step", "configure_gradient_clipping", "lr_scheduler_step"}
# Lightning's own spans: run_training_batch holds the automatic optimization's glue; optimizer_step is the manual
# optimization's LightningOptimizer.step
RUN_TRAINING_BATCH = "run_training_batch"
MANUAL_OPTIMIZER_STEP = "optimizer_step"
# the logger spans the hook profiler adds: "[Logger]TensorBoardLogger.log_metrics"
LOGGER_PREFIX = "[Logger]"
# seconds the callback's own work inside a step (a logging window) was left out of the step: it is taken off
# lightning-perf's own part
EXCLUDED = "!excluded"


@dataclass
class CodeTime:
    """One piece of code the user chose (a callback or a logger class): its time per step and per hook."""

    name: str
    kind: str
    ms_per_step: float
    hooks_ms: dict[str, float] = field(default_factory=dict)


@dataclass
class StepAnatomy:
    """The mean training step, in parts (``PARTS``, milliseconds a step) that add up to ``step_ms``."""

    steps: int
    step_ms: float
    parts_ms: dict[str, float]
    callbacks: list[CodeTime] = field(default_factory=list)
    loggers: list[CodeTime] = field(default_factory=list)
    # 1: ``steps`` are all the steps timed; N: the hooks were timed on every step of the fit's first ones, then on
    # one in N at random (collect.steps.hook_profiler), each counting N times in the means
    sample_every: int = 1

    def share_pct(self, part: str) -> float | None:
        ms = self.parts_ms.get(part)
        if ms is None or self.step_ms <= 0:
            return None
        return ms / self.step_ms * 100.0

    @property
    def hooks_ms(self) -> float:
        """Everything around the model that the user or Lightning adds: hooks, callbacks, loggers, the progress
        bar (not lightning-perf, not the loop's own bookkeeping)."""
        return sum(self.parts_ms.get(part, 0.0) for part in (MODULE_HOOKS, CALLBACKS, PROGRESS_BAR, LOGGERS))


def split_name(name: str) -> tuple[str, str, str]:
    """(owner kind, owner, hook) of a span name: ``[Callback]ModelCheckpoint{...}.on_train_batch_end`` ->
    ("Callback", "ModelCheckpoint{...}", "on_train_batch_end"); Lightning's bare spans -> ("", "", name)."""
    if not name.startswith("["):
        return "", "", name
    close = name.find("]")
    owner_and_hook = name[close + 1 :]
    owner, _, hook = owner_and_hook.rpartition(
        "."
    )  # a callback's state key can hold dots, a hook name cannot
    return name[1:close], owner, hook


def part_of(name: str, callback_kinds: dict[str, str]) -> str | None:
    """The part a span's self time belongs to, or None when it is not part of a training step."""
    kind, owner, hook = split_name(name)
    if kind == "":
        if hook == RUN_TRAINING_BATCH:
            return LOOP
        return OPTIMIZER if hook == MANUAL_OPTIMIZER_STEP else None
    if hook not in STEP_HOOKS:
        return None
    if kind == "Callback":
        return {PROGRESS_BAR_KIND: PROGRESS_BAR, OURS: LIGHTNING_PERF}.get(
            callback_kinds.get(owner, ""), CALLBACKS
        )
    if kind == "Logger":
        return LOGGERS
    if hook in _TRANSFER_HOOKS:
        return TRANSFER
    if kind == "Strategy":
        return {"training_step": FORWARD, "backward": BACKWARD}.get(hook, LOOP)
    if hook == "optimizer_zero_grad":
        return ZERO_GRAD
    if hook in _OPTIMIZER_HOOKS:
        return OPTIMIZER
    return MODULE_HOOKS  # the LightningModule's (or the DataModule's) own hooks


def merge(into: dict[str, float], batch: dict[str, float]) -> None:
    for name, seconds in batch.items():
        into[name] = into.get(name, 0.0) + seconds


def anatomy(
    seconds: dict[str, float],
    batches: int,
    step_ms: float,
    data_wait_ms: float | None,
    callback_kinds: dict[str, str],
) -> StepAnatomy | None:
    """The mean step of ``batches`` batches whose spans took ``seconds`` (self seconds per span name, summed),
    against the step clock's mean step ``step_ms`` and DataLoader wait: the batches are the steps the clock timed
    (the hook profiler keeps no other), so the parts add up to the step. The loop's part is what the spans leave
    of the step (never below 0, should the spans and the clock's boundaries ever disagree)."""
    if batches <= 0 or step_ms <= 0:
        return None
    parts = dict.fromkeys(PARTS, 0.0)
    parts[DATA_WAIT] = data_wait_ms or 0.0
    per_code: dict[tuple[str, str], dict[str, float]] = {}
    for name, total in seconds.items():
        part = part_of(name, callback_kinds)
        if part is None:
            continue
        ms = total / batches * 1e3
        parts[part] += ms
        if part in (CALLBACKS, PROGRESS_BAR, LIGHTNING_PERF, LOGGERS, MODULE_HOOKS):
            kind, owner, hook = split_name(name)
            code = per_code.setdefault((part, owner), {})
            code[hook] = code.get(hook, 0.0) + ms
    excluded_ms = seconds.get(EXCLUDED, 0.0) / batches * 1e3
    parts[LIGHTNING_PERF] = max(0.0, parts[LIGHTNING_PERF] - excluded_ms)
    named = sum(ms for part, ms in parts.items() if part != LOOP)
    parts[LOOP] = max(0.0, step_ms - named)
    callbacks, loggers = [], []
    for (part, owner), hooks in per_code.items():
        code = CodeTime(name=_class_name(owner), kind=part, ms_per_step=sum(hooks.values()), hooks_ms=hooks)
        if part == LIGHTNING_PERF:
            code.ms_per_step = parts[LIGHTNING_PERF]
        (loggers if part == LOGGERS else callbacks).append(code)
    callbacks.sort(key=lambda code: -code.ms_per_step)
    loggers.sort(key=lambda code: -code.ms_per_step)
    return StepAnatomy(
        steps=batches,
        step_ms=step_ms,
        parts_ms=parts,
        callbacks=callbacks,
        loggers=loggers,
    )


def _class_name(state_key: str) -> str:
    """A callback's class from its state key (``ModelCheckpoint{'monitor': None, ...}`` -> ModelCheckpoint)."""
    return state_key.split("{", 1)[0]
