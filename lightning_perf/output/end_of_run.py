"""What happens when a run ends: its summary, the measured probes, the diagnosis, and where they are written.

Called by the callback after the last step (outside any timed step), on every rank for the summary and on
rank zero for the probes, the diagnosis and the writers.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import statistics
import warnings
from typing import TYPE_CHECKING, Any

from lightning.pytorch.utilities import rank_zero_info

from lightning_perf.analysis.summary import SUMMARY_FILENAME, GpuUtilization, RunSummary
from lightning_perf.collect.rank_exchange import RankReducer, rank_table
from lightning_perf.collect.run_state import PerfSession
from lightning_perf.collect.schedule import ProfileSchedule
from lightning_perf.collect.settings_fingerprint import collect_settings, train_dataloader
from lightning_perf.output import loggers as tensorboard
from lightning_perf.probes.cudnn_benchmark import cudnn_benchmark_ab

if TYPE_CHECKING:
    from lightning.pytorch import Trainer

    from lightning_perf.collect.config import PerfConfig

# the verdicts for which probe_num_workers="auto" measures the DataLoader
_PROBED_VERDICTS = ("highly input-bound", "moderately input-bound")


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def build_summary(
    trainer: Any,
    session: PerfSession,
    *,
    status: str,
    wall_s: float,
    started_at: str | None,
    log_dir: str | None,
    sampler: Any,
) -> RunSummary:
    dataloader = train_dataloader(trainer) if session.stage == "fit" else None
    summary = RunSummary(
        run_name=os.path.basename(os.path.normpath(log_dir)) if log_dir else "",
        log_dir=log_dir,
        stage=session.stage,
        status=status,
        started_at=started_at,
        ended_at=now(),
        global_rank=trainer.global_rank,
        world_size=trainer.world_size,
        timing=session.clock.summary(train_wall_s=wall_s),
        settings=collect_settings(trainer, dataloader, session.batch_size_seen, session.input_shapes_vary),
        traces=list(session.window.traces) if session.window is not None else [],
    )
    if sampler is not None:
        summary.utilization = sampler.summary()
    if session.kernel_busy_pct:
        gpu = summary.utilization.gpu or GpuUtilization()
        gpu.kernel_busy_pct = statistics.fmean(session.kernel_busy_pct)
        summary.utilization.gpu = gpu
    return summary


def analyse(
    trainer: Any,
    summary: RunSummary,
    *,
    status: str,
    ab_input: Any,
    ab_cudnn_benchmark: bool,
    probe_num_workers: str,
    probe_budget_s: float,
) -> None:
    """The measured probes (a finished run only), then the diagnosis, into ``summary``."""
    from lightning_perf.analysis.diagnosis import diagnose, input_bound_verdict

    if status == "finished":
        if ab_cudnn_benchmark:
            summary.probes["cudnn_benchmark"] = cudnn_benchmark_ab(
                trainer.lightning_module, ab_input, trainer.strategy.root_device
            )
        verdict = input_bound_verdict(summary.timing.data_wait_pct)
        wanted = probe_num_workers == "always" or (
            probe_num_workers == "auto" and verdict in _PROBED_VERDICTS
        )
        dataloader = train_dataloader(trainer)
        if wanted and dataloader is not None:
            from lightning_perf.probes.num_workers import probe_num_workers as probe

            compute = summary.timing.compute_ms.median if summary.timing.compute_ms else None
            summary.probes["num_workers"] = dataclasses.asdict(
                probe(dataloader, compute, budget_s=probe_budget_s)
            )
    summary.findings = diagnose(summary)


def write(
    trainer: Any, summary: RunSummary, *, log_dir: str | None, log_hparams: bool, hp_placeholder: bool
) -> None:
    """perf_summary.json, and for a fit: the diagnosis (Text tab, console), the probe chart, HParams."""
    summary_path = None
    if log_dir:
        name = SUMMARY_FILENAME if summary.stage == "fit" else f"perf_summary_{summary.stage}.json"
        summary_path = os.path.join(log_dir, name)
        summary.save(summary_path)
    if summary.stage != "fit":
        return
    markdown = None
    if summary.findings:
        from lightning_perf.analysis.findings_render import render_console, render_markdown

        markdown = render_markdown(summary.findings, summary)
        tensorboard.add_text(trainer, "perf/diagnosis", markdown, trainer.global_step)
        rank_zero_info(render_console(summary.findings))
    if "num_workers" in summary.probes:
        tensorboard.log_num_workers_probe(trainer, summary.probes["num_workers"])
    if log_hparams:
        tensorboard.write_hparams(trainer, summary, hp_placeholder)
    # CSV, MLflow, W&B, ...: the same results through each logger's own API
    tensorboard.publish_run_end(trainer, summary, markdown, summary_path)


def short_run_message(schedule: ProfileSchedule, session: PerfSession) -> str | None:
    """One info line when the run ended before the schedule did; None otherwise."""
    last_step = schedule.last_step
    if session.window is None or last_step is None or session.batches > last_step:
        return None
    written = len(session.window.traces)
    outcome = f"{written} trace(s) written." if written else "no step was recorded, so no trace was written."
    return (
        f"lightning-perf: the {session.stage} run ended after {session.batches} batches, shorter than the "
        f"profiling schedule ({schedule.describe()}: {last_step + 1} batches); {outcome}"
    )


def complete(
    trainer: Trainer,
    session: PerfSession,
    config: PerfConfig,
    *,
    status: str,
    wall_s: float,
    started_at: str | None,
    log_dir: str | None,
    sampler: Any,
    reducer: RankReducer | None,
    ab_input: Any,
    hp_placeholder: bool,
) -> RunSummary | None:
    """Summarise, diagnose and write one finished run. Never raises: the run's own outcome wins.

    ``reducer`` is given only when every rank gets here the same way (a rank that raised calls no collective).
    """
    try:
        summary = build_summary(
            trainer,
            session,
            status=status,
            wall_s=wall_s,
            started_at=started_at,
            log_dir=log_dir,
            sampler=sampler,
        )
        if reducer is not None and reducer.distributed:
            summary.ranks = rank_table(reducer, summary)
        if session.stage == "fit" and trainer.is_global_zero and config.diagnose:
            analyse(
                trainer,
                summary,
                status=status,
                ab_input=ab_input,
                ab_cudnn_benchmark=config.ab_cudnn_benchmark,
                probe_num_workers=config.probe_num_workers,
                probe_budget_s=config.probe_budget_s,
            )
    except Exception as err:
        warnings.warn(f"lightning-perf: could not complete the run summary: {err}", stacklevel=2)
        return None
    if trainer.is_global_zero:
        try:
            write(
                trainer,
                summary,
                log_dir=log_dir,
                log_hparams=config.log_hparams,
                hp_placeholder=hp_placeholder,
            )
        except Exception as err:
            warnings.warn(f"lightning-perf: could not write the run summary: {err}", stacklevel=2)
    return summary
