"""Diagnosis rules on the step's anatomy (``analysis.compute.anatomy``): the user's hooks, callbacks, loggers or
progress bar eat the step (``lightning_overhead``), or the optimizer does (``optimizer_share``); and on the profiled
cycle's modules: one module takes most of the model's time (``module_hotspot``).

Each rule is ``(summary, verdict) -> Finding | None``, silent without an anatomy. Pure: no torch, no Lightning.
"""

from __future__ import annotations

from lightning_perf.analysis.compute.anatomy import (
    LOGGERS,
    MODULE_HOOKS,
    OPTIMIZER,
    PROGRESS_BAR,
    CodeTime,
    StepAnatomy,
)
from lightning_perf.analysis.compute.anatomy_text import top_hook
from lightning_perf.analysis.numbers import fmt1
from lightning_perf.analysis.summary import Finding, RunSummary

# Hooks, callbacks, loggers and the progress bar at this share of the mean step or more: the line. Below
# OVERHEAD_MIN_MS a step, a share is a fast step's, not code worth changing (a hook's call costs ~1 us).
OVERHEAD_PCT = 10.0
OVERHEAD_MIN_MS = 0.2
# The optimizer at this share of the step or more, and at least this long: multi-tensor (foreach) and fused
# kernels take a per-parameter loop down to a few launches (PyTorch's optimizer docs: fused > foreach > for-loop).
OPTIMIZER_PCT = 20.0
OPTIMIZER_MIN_MS = 1.0
# One module's self time (forward and backward) at this share of the model's or more: the line. A model of
# one or two modules is its modules, so it takes three; and the module must weigh in the step (10% of it).
MODULE_HOTSPOT_PCT = 30.0
MODULE_HOTSPOT_MIN_MODULES = 3
MODULE_HOTSPOT_STEP_PCT = 10.0


def _share(anatomy: StepAnatomy, ms: float) -> float:
    return ms / anatomy.step_ms * 100.0


def _what_to_do(code: CodeTime) -> str:
    hook = top_hook(code)
    if code.kind == PROGRESS_BAR:
        return (
            "Refresh the progress bar less often (`TQDMProgressBar(refresh_rate=N)`, RichProgressBar likewise), "
            "or turn it off in unattended runs (`Trainer(enable_progress_bar=False)`)."
        )
    if code.kind == LOGGERS:
        return (
            f"`{hook}` writes on the training thread: log less often (`Trainer(log_every_n_steps=N)`), log "
            "per-step values without `sync_dist=True` (it synchronises the ranks every step), and let the logger "
            "buffer its writes (e.g. TensorBoardLogger's `flush_secs`)."
        )
    if code.kind == MODULE_HOOKS:
        return (
            f"Your LightningModule's `{hook.split('.')[-1]}` runs on every step: do its work every N steps, at "
            "epoch ends, or off the training thread."
        )
    return (
        f"`{hook}` runs on every step: do its work every N steps (`if trainer.global_step % N == 0`), at epoch "
        "ends, or off the training thread."
    )


def lightning_overhead(summary: RunSummary, verdict: str | None) -> Finding | None:
    anatomy = summary.anatomy
    if anatomy is None or anatomy.step_ms <= 0:
        return None
    ms = anatomy.hooks_ms
    share = _share(anatomy, ms)
    if share < OVERHEAD_PCT or ms < OVERHEAD_MIN_MS:
        return None
    pieces = sorted(
        (c for c in anatomy.callbacks + anatomy.loggers if c.kind != "lightning_perf"),
        key=lambda c: -c.ms_per_step,
    )
    if not pieces:
        return None
    worst = pieces[0]
    named = ", ".join(
        f"{top_hook(c)} {fmt1(c.ms_per_step)} ms ({fmt1(_share(anatomy, c.ms_per_step))}%)"
        for c in pieces[:3]
    )
    return Finding(
        id="lightning_overhead",
        severity="high" if share >= 3 * OVERHEAD_PCT else "medium",
        title="Hooks, callbacks or loggers take a large share of every step",
        evidence=(
            f"Hooks, callbacks, loggers and the progress bar took {fmt1(ms)} ms of the {fmt1(anatomy.step_ms)} ms "
            f"mean step ({fmt1(share)}%, line {fmt1(OVERHEAD_PCT)}%), over {anatomy.steps} steps: {named}."
        ),
        recommendation=_what_to_do(worst),
    )


def optimizer_share(summary: RunSummary, verdict: str | None) -> Finding | None:
    anatomy = summary.anatomy
    if anatomy is None or anatomy.step_ms <= 0:
        return None
    ms = anatomy.parts_ms.get(OPTIMIZER, 0.0)
    share = _share(anatomy, ms)
    if share < OPTIMIZER_PCT or ms < OPTIMIZER_MIN_MS:
        return None
    return Finding(
        id="optimizer_share",
        severity="medium",
        title="The optimizer takes a large share of every step",
        evidence=(
            f"optimizer.step (with gradient clipping and the LR scheduler) took {fmt1(ms)} ms of the "
            f"{fmt1(anatomy.step_ms)} ms mean step ({fmt1(share)}%, line {fmt1(OPTIMIZER_PCT)}%), over "
            f"{anatomy.steps} steps."
        ),
        recommendation=(
            "Step all parameters in a few kernels: `torch.optim.AdamW(params, fused=True)` (CUDA; Adam, AdamW "
            "and SGD have it) or `foreach=True` (the default where it is supported: check it is not turned off). "
            "Gradient clipping by norm adds a pass over every gradient; clip less often or not at all if the "
            "loss is stable."
        ),
        settings_change={"fused_optimizer": True},  # tune measures it: fused where torch has it, else foreach
    )


def module_hotspot(summary: RunSummary, verdict: str | None) -> Finding | None:
    figures = next((f for f in summary.trace_figures if f.modules), None)
    if figures is None or len(figures.modules) < MODULE_HOTSPOT_MIN_MODULES:
        return None
    model_ms = sum(module.self_ms for module in figures.modules)
    hot = figures.modules[0]  # the costliest by self time
    share = hot.self_ms / model_ms * 100.0 if model_ms > 0 else 0.0
    step_share = figures.pct_of_step(hot.self_ms)
    if share < MODULE_HOTSPOT_PCT or step_share is None or step_share < MODULE_HOTSPOT_STEP_PCT:
        return None
    side = "backward" if hot.backward_self_ms > hot.forward_self_ms else "forward"
    operators = ", ".join(f"{op.name} {op.ms_per_step:.3f} ms" for op in hot.top_operators)
    numbers = [n for n in figures.step_numbers if n is not None]
    steps = f"steps {numbers[0]}-{numbers[-1]}" if numbers else f"{figures.steps} profiled steps"
    return Finding(
        id="module_hotspot",
        severity="medium",
        title=f"One module takes most of the model's time: {hot.path}",
        evidence=(
            f"`{hot.path}` took {hot.self_ms:.3f} ms a step of the model's {model_ms:.3f} ms ({share:.0f}%, line "
            f"{MODULE_HOTSPOT_PCT:.0f}%; {step_share:.0f}% of the step), mostly in {side} (forward "
            f"{hot.forward_self_ms:.3f} ms, backward {hot.backward_self_ms:.3f} ms), in {steps}"
            + (f"; its operators: {operators}." if operators else ".")
        ),
        recommendation=(
            f"Make `{hot.path}` cheaper before anything else in the model: look at its {side} (a Python loop, a "
            "host sync, an unfused chain of small operators); `torch.compile` of that module, lower precision or "
            "a fused kernel are the usual fixes."
        ),
    )
