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
from lightning_perf.atomic_file import describe_os_error
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


def run_probes(trainer: Any, summary: RunSummary, config: PerfConfig, ab_input: Any) -> bool:
    """The measured probes of a finished fit, into ``summary.probes``; True when one ran.

    Runs after the summary of what training measured is written, with one line saying so and what it may
    cost: an interrupt here (Ctrl-C while waiting) loses nothing but the probe.
    """
    from lightning_perf.analysis.diagnosis import input_bound_verdict

    ran = False
    if config.ab_cudnn_benchmark:  # without a kept batch (CPU, no convolutions) it only says why not
        if ab_input is not None:
            rank_zero_info("lightning-perf: measuring cudnn.benchmark off and on (one batch, a few seconds)")
        summary.probes["cudnn_benchmark"] = cudnn_benchmark_ab(
            trainer.lightning_module, ab_input, trainer.strategy.root_device
        )
        ran = True
    verdict = input_bound_verdict(summary.timing.data_wait_pct)
    mode = config.probe_num_workers
    dataloader = train_dataloader(trainer)
    if dataloader is not None and (mode == "always" or (mode == "auto" and verdict in _PROBED_VERDICTS)):
        from lightning_perf.probes.num_workers import probe_num_workers as probe

        rank_zero_info(
            f"lightning-perf: measuring DataLoader num_workers (up to {config.probe_budget_s:g} s; "
            f"{SUMMARY_FILENAME} is written, Ctrl-C skips this)"
        )
        compute = summary.timing.compute_ms.median if summary.timing.compute_ms else None
        summary.probes["num_workers"] = dataclasses.asdict(
            probe(dataloader, compute, budget_s=config.probe_budget_s)
        )
        ran = True
    return ran


def write(
    trainer: Any, summary: RunSummary, *, log_dir: str | None, log_hparams: bool, hp_placeholder: bool
) -> None:
    """perf_summary.json, and for a fit: the diagnosis (Text tab, console), HParams. Never raises."""
    _save(summary, log_dir)
    if summary.stage != "fit":
        return
    _show_findings(trainer, summary)
    if log_hparams:
        _safely("write the HParams", lambda: tensorboard.write_hparams(trainer, summary, hp_placeholder))


def _save(summary: RunSummary, log_dir: str | None, update: bool = False) -> None:
    if log_dir:
        name = SUMMARY_FILENAME if summary.stage == "fit" else f"perf_summary_{summary.stage}.json"
        path = os.path.join(log_dir, name)
        if update and not os.path.exists(path):
            return  # the first write failed and warned: the disk said no once, not twice
        _safely(f"write {path}", lambda: summary.save(path))


def _show_findings(trainer: Any, summary: RunSummary) -> None:
    if summary.findings:
        _safely("show the diagnosis", lambda: _render_findings(trainer, summary))


def _render_findings(trainer: Any, summary: RunSummary) -> None:
    from lightning_perf.analysis.findings_render import render_console, render_markdown

    tensorboard.add_text(
        trainer, "perf/diagnosis", render_markdown(summary.findings, summary), trainer.global_step
    )
    rank_zero_info(render_console(summary.findings))


def _safely(what: str, job: Any) -> None:
    try:
        job()
    except Exception as err:  # the run's own outcome wins; one warning names what was lost and why
        reason = describe_os_error(err) if isinstance(err, OSError) else err
        warnings.warn(f"lightning-perf: could not {what}: {reason}", stacklevel=3)


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
    hp_placeholder: bool,
) -> RunSummary | None:
    """Summarise, diagnose and write what one run measured. Never raises: the run's own outcome wins.

    ``reducer`` is given only when every rank gets here the same way (a rank that raised calls no collective).
    The probes come after, in :func:`probe_and_update`, so that nothing measured waits on them.
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
        if _diagnosed(trainer, summary, config):
            from lightning_perf.analysis.diagnosis import diagnose

            summary.findings = diagnose(summary)
    except Exception as err:
        warnings.warn(f"lightning-perf: could not complete the run summary: {err}", stacklevel=2)
        return None
    if trainer.is_global_zero:
        write(
            trainer, summary, log_dir=log_dir, log_hparams=config.log_hparams, hp_placeholder=hp_placeholder
        )
    return summary


def probe_and_update(
    trainer: Trainer, summary: RunSummary, config: PerfConfig, *, log_dir: str | None, ab_input: Any
) -> None:
    """After a finished fit's summary is written: the probes, then the summary and diagnosis updated
    (atomically). ``KeyboardInterrupt`` propagates and leaves the first summary as it was; errors warn."""
    if summary.status != "finished" or not _diagnosed(trainer, summary, config):
        return
    from lightning_perf.analysis.diagnosis import diagnose

    try:
        if not run_probes(trainer, summary, config, ab_input):
            return
        findings = diagnose(summary)
    except KeyboardInterrupt:
        rank_zero_info(f"lightning-perf: probes interrupted; {SUMMARY_FILENAME} keeps what training measured")
        raise
    except Exception as err:
        warnings.warn(f"lightning-perf: a measured probe failed: {err}", stacklevel=2)
        return
    changed = findings != summary.findings
    summary.findings = findings
    _save(summary, log_dir, update=True)
    if "num_workers" in summary.probes:
        tensorboard.log_num_workers_probe(trainer, summary.probes["num_workers"])
    if changed:
        _show_findings(trainer, summary)


def _diagnosed(trainer: Any, summary: RunSummary, config: PerfConfig) -> bool:
    return summary.stage == "fit" and trainer.is_global_zero and config.diagnose
