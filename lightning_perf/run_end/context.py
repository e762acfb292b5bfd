"""What the callback hands over as a run ends (:class:`RunEnd`), to
:func:`lightning_perf.run_end.pipeline.finish_run` and each of its steps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lightning_perf.analysis.summary import RunSummary

if TYPE_CHECKING:
    from lightning.pytorch import Trainer

    from lightning_perf.collect.config import PerfConfig
    from lightning_perf.collect.rank_exchange import RankReducer
    from lightning_perf.collect.run_state import PerfSession
    from lightning_perf.probes.cudnn_benchmark import BatchSpec


@dataclass
class RunEnd:
    """What the callback knows as a run ends, and the summary once :func:`finish_run` has measured it."""

    trainer: Trainer
    session: PerfSession
    config: PerfConfig
    # "finished", "interrupted" or "failed" (collect.run_state.run_status)
    status: str
    # seconds from the start of training to the end of its last step
    wall_s: float
    started_at: str | None
    log_dir: str | None
    # the stopped utilization sampler of a fit; None without one
    sampler: Any
    # given only when every rank gets here the same way (a rank that raised calls no collective)
    reducer: RankReducer | None
    # the shape of a training batch for the cudnn.benchmark A/B; None when none was seen
    ab_spec: BatchSpec | None
    # whether Lightning's hp_metric placeholder was turned off for our HParams (output.loggers)
    hp_placeholder: bool
    # set once measured: the caller's even when a Ctrl-C in the probe propagates
    summary: RunSummary | None = None
