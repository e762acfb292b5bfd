"""What happens when a run ends: its summary, the measured probes, the diagnosis, and where they are written.

Called by the callback after the last step (outside any timed step), on every rank for the summary and on
rank zero for the probes, the diagnosis and the writers.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from typing import TYPE_CHECKING, Any

from lightning_perf import console
from lightning_perf.analysis import metrics
from lightning_perf.analysis.summary import SUMMARY_FILENAME, RunSummary
from lightning_perf.collect.rank_exchange import RankReducer, rank_table
from lightning_perf.collect.run_state import PerfSession
from lightning_perf.collect.schedule import ProfileSchedule
from lightning_perf.collect.settings_fingerprint import collect_settings, train_dataloader
from lightning_perf.collect.step_clock import STEP_TIME_MS
from lightning_perf.output import loggers as tensorboard
from lightning_perf.output import trace_findings
from lightning_perf.probes.cudnn_benchmark import BatchSpec, run_on_ranks

if TYPE_CHECKING:
    from lightning.pytorch import Trainer

    from lightning_perf.collect.config import PerfConfig

log = console.logger(__name__)

# the verdicts for which probe_num_workers="auto" measures the DataLoader
_PROBED_VERDICTS = ("highly input-bound", "moderately input-bound")
# the kind of our gather that asks every rank whether it can run the cudnn.benchmark A/B (windows are 1, final 2)
_AB_READY = 3.0


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
        settings=collect_settings(
            trainer,
            dataloader,
            session.batch_size_seen,
            session.input_shapes_vary,
            session.loader_yields_cuda,
        ),
        traces=list(session.window.traces) if session.window is not None else [],
    )
    if sampler is not None:
        summary.utilization = sampler.summary()
    trace_findings.read_cycles(trainer, session.cuda_traces, summary)
    return summary


def analyse(
    trainer: Any,
    summary: RunSummary,
    *,
    status: str,
    probe_num_workers: str,
    probe_budget_s: float,
) -> None:
    """The measured probes (a finished run only), then the diagnosis, into ``summary``."""
    from lightning_perf.analysis.diagnosis import diagnose, input_bound_verdict
    from lightning_perf.analysis.gpu_measures import input_wait

    if status == "finished":
        verdict = input_bound_verdict(input_wait(summary).value)
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
    summary.findings = trace_findings.with_trace_findings(summary)


def cudnn_ab(trainer: Any, spec: BatchSpec | None, reducer: RankReducer | None) -> dict[str, Any]:
    """The cudnn.benchmark A/B on this rank, all ranks together under DDP (``reducer`` given) or not at all."""

    def agree(ready: bool) -> bool:
        # a gather on the reducer's bounded gloo group: a rank that cannot run makes every rank skip
        per_rank = reducer.gather(_AB_READY, {STEP_TIME_MS: float(ready)})
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


def write(
    trainer: Any, summary: RunSummary, *, log_dir: str | None, log_hparams: bool, hp_placeholder: bool
) -> None:
    """perf_summary.json, and for a fit: the diagnosis (Text tab, console), the probe chart, HParams."""
    if log_dir:
        name = SUMMARY_FILENAME if summary.stage == "fit" else f"perf_summary_{summary.stage}.json"
        summary.save(os.path.join(log_dir, name))
    if summary.stage != "fit":
        return
    if summary.findings:
        from lightning_perf.analysis.findings_render import render_console, render_markdown

        markdown = render_markdown(summary.findings, summary)
        tensorboard.add_text(trainer, metrics.DIAGNOSIS_TEXT.tag, markdown, trainer.global_step)
        log.info(render_console(summary.findings))
    trace_findings.log_chart(trainer, summary)
    if "num_workers" in summary.probes:
        tensorboard.log_num_workers_probe(trainer, summary.probes["num_workers"])
    if log_hparams:
        tensorboard.write_hparams(trainer, summary, hp_placeholder)


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
    ab_spec: BatchSpec | None,
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
        fit = session.stage == "fit" and config.diagnose
        if fit and status == "finished" and config.ab_cudnn_benchmark:  # on every rank: see run_on_ranks
            ab = cudnn_ab(trainer, ab_spec, reducer)
            if trainer.is_global_zero:
                summary.probes["cudnn_benchmark"] = ab
        if fit and trainer.is_global_zero:
            analyse(
                trainer,
                summary,
                status=status,
                probe_num_workers=config.probe_num_workers,
                probe_budget_s=config.probe_budget_s,
            )
    except Exception as err:
        log.warning(f"lightning-perf: could not complete the run summary: {err}")
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
            log.warning(f"lightning-perf: could not write the run summary: {err}")
    return summary
