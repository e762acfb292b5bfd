"""Diagnosis rules about the run around the steps: validation, checkpoints, ranks.

Each rule is ``(summary, verdict) -> Finding | None``: silent when its evidence is absent.
"""

from __future__ import annotations

import math
from typing import Any

from lightning_perf.analysis.numbers import fmt1 as _fmt
from lightning_perf.analysis.numbers import whole
from lightning_perf.analysis.rules import cross_rank
from lightning_perf.analysis.rules.helpers import change_text, every_n, share_pct
from lightning_perf.analysis.rules.thresholds import OVERHEAD_SHARE_PCT
from lightning_perf.analysis.summary import Finding, RunSummary, Settings


def _overhead(summary: RunSummary, kind: str, seconds: float) -> tuple[int, str] | None:
    """(how much rarer it must run, the evidence) when ``kind`` takes too much of the wall time."""
    wall_s = summary.timing.train_wall_s
    share = share_pct(seconds, wall_s)
    if share is None or share < OVERHEAD_SHARE_PCT:
        return None
    evidence = (
        f"{kind} took {_fmt(seconds)} s of {_fmt(wall_s)} s training wall time ({_fmt(share)}%, "
        f"line {_fmt(OVERHEAD_SHARE_PCT)}%)."
    )
    return every_n(seconds, wall_s), evidence


def _fewer_epochs_apart(current: int, rarer: int, max_epochs: int | None) -> int | None:
    """Every how many epochs, ``rarer`` times as rare as every ``current``, without leaving the run with none:
    capped at ``max_epochs`` (it then runs once, at the last epoch); None when it cannot get rarer."""
    epochs = current * rarer
    if max_epochs is not None and max_epochs > 0:
        epochs = min(epochs, max_epochs)
    return epochs if epochs > current else None


def validate_less_often(settings: Settings, rarer: int) -> dict[str, Any]:
    """The Trainer settings that validate ``rarer`` times less often, in the terms the user set, or {} when
    validation cannot get rarer without being turned off (e.g. once per epoch with ``max_epochs=1``).

    Unknown settings (summaries of older versions) are taken as Lightning's defaults: once per epoch."""
    interval = 1.0 if settings.val_check_interval is None else settings.val_check_interval
    per_epoch = settings.check_val_every_n_epoch
    change: dict[str, Any] = {}
    if isinstance(interval, float) and interval < 1.0:
        # a fraction of an epoch between validations: a larger fraction, up to once per epoch
        if interval * rarer < 1.0:
            return {"val_check_interval": round(interval * rarer, 3)}
        change["val_check_interval"] = 1.0
        rarer = math.ceil(interval * rarer)
    elif whole(interval) is not None:
        # a number of batches between validations; within an epoch unless check_val_every_n_epoch is None
        batches = interval * rarer
        per_epoch_batches = settings.train_batches_per_epoch
        if per_epoch is None or per_epoch_batches is None or batches <= per_epoch_batches:
            return {"val_check_interval": batches}
        change["val_check_interval"] = 1.0
        rarer = math.ceil(batches / per_epoch_batches)
    epochs = _fewer_epochs_apart(per_epoch or 1, rarer, settings.max_epochs)
    if epochs is not None:
        change["check_val_every_n_epoch"] = epochs
    return change


def fewer_validation_batches(settings: Settings, rarer: int) -> dict[str, Any]:
    """``limit_val_batches`` ``rarer`` times smaller than the user's (a fraction stays a fraction)."""
    limit = 1.0 if settings.limit_val_batches is None else settings.limit_val_batches
    if whole(limit) is not None:
        return {"limit_val_batches": max(1, limit // rarer)}
    return {"limit_val_batches": round(limit / rarer, 3)}


def validation_share(summary: RunSummary, verdict: str | None) -> Finding | None:
    found = _overhead(summary, "Validation", summary.timing.validation_s)
    if found is None:
        return None
    rarer, evidence = found
    change = validate_less_often(summary.settings, rarer)
    if change:
        recommendation = (
            f"Validate less often ({change_text(change)}) or on fewer batches (`limit_val_batches`)."
        )
    else:  # as rare as it gets in this run: fewer batches, never no validation
        change = fewer_validation_batches(summary.settings, rarer)
        recommendation = (
            f"Validation already runs as rarely as this run allows; validate on fewer batches "
            f"({change_text(change)})."
        )
    return Finding(
        id="validation_share",
        severity="medium",
        title="Validation takes a large share of training time",
        evidence=evidence,
        recommendation=recommendation,
        settings_change=change,
    )


def checkpoint_share(summary: RunSummary, verdict: str | None) -> Finding | None:
    found = _overhead(summary, "Saving checkpoints", summary.timing.checkpoint_s)
    if found is None:
        return None
    rarer, evidence = found
    # never so rare that a run of max_epochs saves no checkpoint
    epochs = _fewer_epochs_apart(1, rarer, summary.settings.max_epochs)
    change = {"every_n_epochs": epochs} if epochs is not None else {}
    how = f"`ModelCheckpoint(every_n_epochs={epochs})`" if epochs is not None else "`every_n_train_steps`"
    return Finding(
        id="checkpoint_share",
        severity="medium",
        title="Checkpointing takes a large share of training time",
        evidence=evidence,
        recommendation=f"Save less often ({how}), keep fewer (`save_top_k`) or write to faster storage.",
        settings_change=change,
    )


def straggler(summary: RunSummary, verdict: str | None) -> Finding | None:
    """The cross-rank rule (:mod:`lightning_perf.analysis.rules.cross_rank`) over the per-rank table."""
    return cross_rank.straggler(cross_rank.rows_from_stats(summary.ranks))


def collective_wait(summary: RunSummary, verdict: str | None) -> Finding | None:
    """The ranks that wait in the gradient all-reduce for the straggler (estimated from the per-rank table)."""
    return cross_rank.collective_wait(cross_rank.rows_from_stats(summary.ranks))
