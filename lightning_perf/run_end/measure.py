"""The first step as a run ends: what it measured, as its :class:`RunSummary`. Training's own figures, the rank
table, the MFU against the device's peak, the cudnn.benchmark A/B and a worker's hand-off of one batch.

On every rank (the summary, the rank table and the A/B: all ranks together, or none); the hand-off on rank zero
of an input-bound fit only. A step of :func:`lightning_perf.run_end.pipeline.finish_run`.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

from lightning_perf.analysis.probe_results import CudnnAB
from lightning_perf.analysis.summary import RunSummary
from lightning_perf.collect.rank_exchange import RankReducer, rank_table
from lightning_perf.collect.sampling.machine_state import with_gpu_clocks
from lightning_perf.collect.settings_fingerprint import collect_settings, train_dataloader
from lightning_perf.collect.steps import hook_profiler
from lightning_perf.collect.steps.step_clock import STEP_TIME_MS
from lightning_perf.output import trace_findings
from lightning_perf.probes.cudnn_benchmark import BatchSpec, run_on_ranks
from lightning_perf.run_end import device_limit
from lightning_perf.run_end.context import RunEnd
from lightning_perf.run_end.probing import handoff_plan, measure_handoff

# the kind of our gather that asks every rank whether it can run the cudnn.benchmark A/B (windows are 1, final 2)
_AB_READY = 3.0


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def measure(end: RunEnd) -> RunSummary:
    """The run's summary with everything measured after its last step; the diagnosis is not in it yet."""
    trainer, config = end.trainer, end.config
    summary = build_summary(end)
    if end.reducer is not None and end.reducer.distributed:
        summary.ranks = rank_table(end.reducer, summary)
    fit = end.session.stage == "fit" and config.diagnose
    if fit and end.status == "finished" and config.ab_cudnn_benchmark:  # on every rank: see run_on_ranks
        ab = cudnn_ab(trainer, end.ab_spec, end.reducer)
        if trainer.is_global_zero:
            summary.probes.cudnn_benchmark = ab
    handoff_loader = handoff_plan(trainer, summary, config)
    if handoff_loader is not None:  # an input-bound fit: what a worker's hand-off costs, before any advice
        measure_handoff(summary, handoff_loader)
    return summary


def build_summary(end: RunEnd) -> RunSummary:
    """Training's own figures: the step clock, the settings, the sampler's utilization and memory, the
    compilations, the slowdowns, the step's anatomy, the traces' cycles and the MFU."""
    trainer, session, log_dir, sampler = end.trainer, end.session, end.log_dir, end.sampler
    compiled = session.compiles.finish() if session.compiles is not None else None  # first: stop watching
    dataloader = train_dataloader(trainer) if session.stage == "fit" else None
    summary = RunSummary(
        run_name=os.path.basename(os.path.normpath(log_dir)) if log_dir else "",
        log_dir=log_dir,
        stage=session.stage,
        status=end.status,
        started_at=end.started_at,
        ended_at=now(),
        global_rank=trainer.global_rank,
        world_size=trainer.world_size,
        timing=session.clock.summary(train_wall_s=end.wall_s),
        settings=collect_settings(
            trainer,
            dataloader,
            session.batch_size_seen,
            session.input_shapes_vary,
            session.loader_yields_cuda,
        ),
        traces=list(session.window.traces) if session.window is not None else [],
        trace_ranks=list(session.traced_ranks),
        machine=session.machine.finish(),
        compile=compiled,
        slowdowns=list(session.watch.slowdowns) if session.watch is not None else [],
    )
    timing = summary.timing
    if session.fetches_sampled:
        timing.fetch_wall_ms, timing.fetch_cpu_ms = session.fetch_wall_s * 1e3, session.fetch_cpu_s * 1e3
        timing.fetches_sampled = session.fetches_sampled
    if session.fetches_runqueue_sampled:
        timing.fetch_runqueue_ms = session.fetch_runqueue_s * 1e3
        timing.fetch_runqueue_wall_ms = session.fetch_runqueue_wall_s * 1e3
        timing.fetches_runqueue_sampled = session.fetches_runqueue_sampled
    if sampler is not None:
        summary.utilization = sampler.summary()
        summary.machine = with_gpu_clocks(summary.machine, sampler)
        if sampler.memory is not None:
            summary.memory = sampler.memory.series(sampler.interval_s)
    if session.hooks is not None:
        summary.anatomy = hook_profiler.run_anatomy(
            session.hooks,
            timing.step_time_ms.mean if timing.step_time_ms else None,
            timing.data_wait_ms.mean if timing.data_wait_ms else None,
        )
    trace_findings.read_cycles(trainer, session.cuda_traces, summary)
    device_limit.attach(trainer, session, summary)
    return summary


def cudnn_ab(trainer: Any, spec: BatchSpec | None, reducer: RankReducer | None) -> CudnnAB:
    """The cudnn.benchmark A/B on this rank, all ranks together under DDP (``reducer`` given) or not at all."""

    def agree(ready: bool) -> bool:
        # a gather on the reducer's bounded gloo group: a rank that cannot run makes every rank skip
        per_rank = reducer.gather(_AB_READY, {STEP_TIME_MS: float(ready)}) if reducer is not None else None
        return per_rank is not None and all(row.get(STEP_TIME_MS) == 1.0 for row in per_rank)

    distributed = reducer is not None and reducer.distributed and not reducer.failed
    return run_on_ranks(
        trainer.lightning_module,
        spec,
        trainer.strategy.root_device,
        world_size=int(trainer.world_size),
        agree=agree if distributed else None,
        precision_plugin=trainer.precision_plugin,
    )
