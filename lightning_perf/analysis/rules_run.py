"""Diagnosis rules about the run around the steps: validation, checkpoints, ranks.

Each rule is ``(summary, verdict) -> Finding | None``: silent when its evidence is absent.
"""

from __future__ import annotations

import statistics

from lightning_perf.analysis.numbers import finite as _num
from lightning_perf.analysis.numbers import fmt1 as _fmt
from lightning_perf.analysis.rule_helpers import (
    every_n,
    others,
    share_pct,
)
from lightning_perf.analysis.summary import Finding, RunSummary
from lightning_perf.analysis.thresholds import (
    OVERHEAD_SHARE_PCT,
    STRAGGLER_MIN_GAP_MS,
    STRAGGLER_RATIO,
)


def validation_share(summary: RunSummary, verdict: str | None) -> Finding | None:
    timing = summary.timing
    share = share_pct(timing.validation_s, timing.train_wall_s)
    if share is None or share < OVERHEAD_SHARE_PCT:
        return None
    every = every_n(timing.validation_s, timing.train_wall_s)
    return Finding(
        id="validation_share",
        severity="medium",
        title="Validation takes a large share of training time",
        evidence=f"Validation took {_fmt(timing.validation_s)} s of {_fmt(timing.train_wall_s)} s "
        f"training wall time ({_fmt(share)}%, line {_fmt(OVERHEAD_SHARE_PCT)}%).",
        recommendation=f"Validate less often (`check_val_every_n_epoch={every}`, a larger "
        "`val_check_interval`) or on fewer batches (`limit_val_batches`).",
        settings_change={"check_val_every_n_epoch": every},
    )


def checkpoint_share(summary: RunSummary, verdict: str | None) -> Finding | None:
    timing = summary.timing
    share = share_pct(timing.checkpoint_s, timing.train_wall_s)
    if share is None or share < OVERHEAD_SHARE_PCT:
        return None
    every = every_n(timing.checkpoint_s, timing.train_wall_s)
    return Finding(
        id="checkpoint_share",
        severity="medium",
        title="Checkpointing takes a large share of training time",
        evidence=f"Saving checkpoints took {_fmt(timing.checkpoint_s)} s of {_fmt(timing.train_wall_s)} s "
        f"training wall time ({_fmt(share)}%, line {_fmt(OVERHEAD_SHARE_PCT)}%).",
        recommendation=f"Save less often (`ModelCheckpoint(every_n_epochs={every})`), keep fewer "
        "(`save_top_k`) or write to faster storage.",
        settings_change={"every_n_epochs": every},
    )


def straggler(summary: RunSummary, verdict: str | None) -> Finding | None:
    if len(summary.ranks) < 2:
        return None
    lines: list[str] = []
    names: list[str] = []
    for stats in summary.ranks:
        for metric, label in (("step_time_ms", "step time"), ("data_wait_ms", "data wait")):
            value = _num(getattr(stats, metric))
            values = [_num(getattr(o, metric)) for o in summary.ranks if o is not stats]
            others_known = [v for v in values if v is not None]
            if value is None or not others_known:
                continue
            median = statistics.median(others_known)
            if value > STRAGGLER_RATIO * median and value - median >= STRAGGLER_MIN_GAP_MS:
                ratio = f"{value / median:.2f}x" if median > 0 else "above zero"
                lines.append(
                    f"rank {stats.rank} on {stats.host}: {label} {_fmt(value)} ms vs {_fmt(median)} ms "
                    f"median of {others(len(others_known))} ({ratio})"
                )
                name = f"rank {stats.rank} ({stats.host})"
                if name not in names:
                    names.append(name)
    if not lines:
        return None
    return Finding(
        id="straggler",
        severity="medium",
        title="Straggler: " + ", ".join(names),
        evidence="; ".join(lines) + ". Every rank waits for the slowest one at each gradient all-reduce.",
        recommendation="Check that host for CPU contention, slower storage or fewer cores per DataLoader, "
        "and for a throttled or shared GPU.",
    )
