"""What a variant's rounds show besides their speed: the training loss (so a change of numerics is seen to
still train) and the time ``torch.compile`` took (kept apart: the steps that compiled are left out of the step
times by the PerfCallback, the trial's warm-up steps too).

Pure: reads each round's ``round_loss.json`` (written by :mod:`lightning_perf.trial.compute.loss`) and its
summary's ``compile`` part.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from typing import Any

LOSS_FILENAME = "round_loss.json"


@dataclass
class RoundFigures:
    """Means over a variant's rounds: each round's mean training loss and last step's loss, and seconds of
    compilation a round (None: no round compiled anything)."""

    loss: float | None = None
    last_loss: float | None = None
    loss_rounds: int = 0
    compile_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_loss(round_dir: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(round_dir, LOSS_FILENAME), encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def variant_figures(variant: Any) -> RoundFigures:
    """The figures of a :class:`~lightning_perf.trial.spec.VariantResult`'s rounds."""
    losses = [found for found in (read_loss(d) for d in variant.round_dirs) if found]
    compiled = [r.compile.total_s for r in variant.rounds if r.compile is not None and r.compile.compiles]
    figures = RoundFigures(loss_rounds=len(losses))
    if losses:
        figures.loss = sum(f["mean"] for f in losses) / len(losses)
        figures.last_loss = sum(f["last"] for f in losses) / len(losses)
    if compiled:
        figures.compile_s = sum(compiled) / len(compiled)
    return figures


def trial_figures(trial: Any) -> dict[str, RoundFigures]:
    """Each variant's figures, by name (a variant that failed has none)."""
    return {v.name: variant_figures(v) for v in trial.variants if v.ok} if trial is not None else {}


def beside(figures: dict[str, RoundFigures], name: str, baseline: str) -> str:
    """``; mean loss 2.28 (baseline 2.30); compile 3.1 s a round, not in the step times``, or ``""``."""
    own, base = figures.get(name), figures.get(baseline)
    if own is None:
        return ""
    text = ""
    if own.loss is not None:
        text += f"; mean loss {_loss(own.loss)}"
        text += f" (baseline {_loss(base.loss)})" if base is not None and base.loss is not None else ""
    if own.compile_s is not None:
        text += f"; compile {own.compile_s:.1f} s a round, not in the step times"
    return text


def figures_lines(trial: Any) -> list[str]:
    """A trial's report lines: each variant's mean training loss over its rounds, and compile time a round."""
    figures = trial_figures(trial)
    losses = [f"{name} {_loss(f.loss)}" for name, f in figures.items() if f.loss is not None]
    compiled = [f"{name} {f.compile_s:.1f} s" for name, f in figures.items() if f.compile_s is not None]
    lines = ["mean training loss over the rounds: " + ", ".join(losses)] if losses else []
    if compiled:
        lines.append("torch.compile a round (not in the step times): " + ", ".join(compiled))
    return lines


def _loss(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else f"{value} (not finite: training diverged)"
