"""What happens when a run ends: its summary, the measured probes, the diagnosis, and where they are written.

Called by the callback after the last step (outside any timed step), on every rank for the summary and the
cudnn.benchmark A/B (all ranks together, or none), on rank zero for the diagnosis and the writers. What
training measured is saved first (:func:`complete`); when the num_workers probe follows, the findings are shown
and written once, after it (:func:`probe_and_update`): one answer per run, and an interrupt during the probe
loses nothing measured.
"""

from __future__ import annotations

import datetime
import os
import shlex
from typing import TYPE_CHECKING, Any

from lightning_perf import console
from lightning_perf.analysis import metrics
from lightning_perf.analysis.summary import SUMMARY_FILENAME, RunSummary
from lightning_perf.atomic_file import atomic_open, describe_os_error
from lightning_perf.collect.profiling.schedule import ProfileSchedule
from lightning_perf.collect.rank_exchange import RankReducer, rank_table
from lightning_perf.collect.run_state import PerfSession
from lightning_perf.collect.sampling.machine_state import with_gpu_clocks
from lightning_perf.collect.settings_fingerprint import collect_settings, train_dataloader
from lightning_perf.collect.steps import hook_profiler
from lightning_perf.collect.steps.step_clock import STEP_TIME_MS
from lightning_perf.output import device_limit, trace_findings
from lightning_perf.output import loggers as tensorboard
from lightning_perf.output.after_fit_probes import (
    diagnosed,
    handoff_plan,
    measure_handoff,
    probe_num_workers,
    probe_plan,
)
from lightning_perf.output.other_loggers import DIAGNOSIS_FILE
from lightning_perf.probes.cudnn_benchmark import BatchSpec, run_on_ranks

if TYPE_CHECKING:
    from lightning.pytorch import Trainer

    from lightning_perf.collect.config import PerfConfig

log = console.logger(__name__)

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
    compiled = session.compiles.finish() if session.compiles is not None else None  # first: stop watching
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
        trace_ranks=list(session.traced_ranks),
        machine=session.machine.finish(),
        compile=compiled,
        slowdowns=list(session.watch.slowdowns) if session.watch is not None else [],
    )
    if session.fetches_sampled:
        timing = summary.timing
        timing.fetch_wall_ms, timing.fetch_cpu_ms = session.fetch_wall_s * 1e3, session.fetch_cpu_s * 1e3
        timing.fetches_sampled = session.fetches_sampled
    if session.fetches_runqueue_sampled:
        timing = summary.timing
        timing.fetch_runqueue_ms = session.fetch_runqueue_s * 1e3
        timing.fetch_runqueue_wall_ms = session.fetch_runqueue_wall_s * 1e3
        timing.fetches_runqueue_sampled = session.fetches_runqueue_sampled
    if sampler is not None:
        summary.utilization = sampler.summary()
        summary.machine = with_gpu_clocks(summary.machine, sampler)
        if sampler.memory is not None:
            summary.memory = sampler.memory.series(sampler.interval_s)
    if session.hooks is not None:
        timing = summary.timing
        summary.anatomy = hook_profiler.run_anatomy(
            session.hooks,
            timing.step_time_ms.mean if timing.step_time_ms else None,
            timing.data_wait_ms.mean if timing.data_wait_ms else None,
        )
    trace_findings.read_cycles(trainer, session.cuda_traces, summary)
    device_limit.attach(trainer, session, summary)
    return summary


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


def diagnose_run(summary: RunSummary) -> None:
    """The summary's own findings and those of its CUDA traces."""
    from lightning_perf.analysis.diagnosis import diagnose

    summary.findings = diagnose(summary)
    summary.findings = trace_findings.with_trace_findings(summary)


def write(
    trainer: Any, summary: RunSummary, config: PerfConfig, *, log_dir: str | None, hp_placeholder: bool
) -> None:
    """perf_summary.json, and for a fit: the diagnosis (Text tab, console, perf_diagnosis.md), the trace chart,
    HParams. Never raises."""
    summary_path = _save(summary, log_dir)
    if summary.stage != "fit":
        return
    markdown = _show_findings(trainer, summary, no_trace_hint(summary, config))
    if markdown is not None and log_dir:
        path = os.path.join(log_dir, DIAGNOSIS_FILE)
        _safely(f"write {path}", lambda: _write_text(path, markdown))
    _safely("draw the trace chart", lambda: trace_findings.log_chart(trainer, summary))
    if config.log_hparams:
        _safely("write the HParams", lambda: tensorboard.write_hparams(trainer, summary, hp_placeholder))
    # CSV, MLflow, W&B, ...: the same results through each logger's own API
    _safely(
        "publish to the other loggers",
        lambda: tensorboard.publish_run_end(trainer, summary, markdown, summary_path),
    )


def _write_text(path: str, text: str) -> None:
    with atomic_open(path) as handle:
        handle.write(text)


def _save(summary: RunSummary, log_dir: str | None, update: bool = False) -> str | None:
    """Write the summary file; its path, or None when there is none (no log dir, or the disk said no)."""
    if not log_dir:
        return None
    name = SUMMARY_FILENAME if summary.stage == "fit" else f"perf_summary_{summary.stage}.json"
    path = os.path.join(log_dir, name)
    if update and not os.path.exists(path):
        return None  # the first write failed and warned: the disk said no once, not twice
    # a failed write leaves any older file in place: only a path written now is handed on
    return path if _safely(f"write {path}", lambda: summary.save(path)) else None


def _show_findings(trainer: Any, summary: RunSummary, no_trace: str | None) -> str | None:
    """The diagnosis in the Text tab and on the console; its Markdown (None without findings or on an error)."""
    if not summary.findings:
        return None
    shown: list[str] = []
    _safely("show the diagnosis", lambda: shown.append(_render_findings(trainer, summary, no_trace)))
    return shown[0] if shown else None


def _render_findings(trainer: Any, summary: RunSummary, no_trace: str | None) -> str:
    from lightning_perf.analysis.findings_render import answer_markdown, render_answer

    markdown = answer_markdown(summary.findings, summary, no_trace)
    tensorboard.add_text(trainer, metrics.DIAGNOSIS_TEXT.tag, markdown, trainer.global_step)
    log.info(render_answer(summary.findings, summary, no_trace))
    return markdown


def no_trace_hint(summary: RunSummary, config: PerfConfig) -> str | None:
    """Why the run has no trace to show operators from, and how to get one; None when it has one."""
    if summary.trace_figures:
        return None
    if not config.enable_profiler:
        return "no trace recorded: the profiler is off (enable_profiler=False)"
    if summary.traces:
        return "no trace could be read (see the warning above); `lightning-perf report` names the error"
    schedule = config.schedule
    first = schedule.skip_first + schedule.cycle_length
    return (
        f"no trace recorded: run longer than {first} steps or set a shorter profiling schedule "
        f"(now {schedule.describe()}: the first trace is written after batch {first})"
    )


def where_line(summary: RunSummary, log_dir: str | None) -> str | None:
    """The last line of a fit: its folder, the files in it, and the commands that open them."""
    if not log_dir or not os.path.isdir(log_dir):
        return None
    names = [n for n in (SUMMARY_FILENAME, DIAGNOSIS_FILE) if os.path.isfile(os.path.join(log_dir, n))]
    traces = [t.path for t in summary.traces]
    if traces or len(summary.trace_ranks) > 1:
        names.append(traces_phrase(traces, summary.trace_ranks, summary.global_rank))
    folder = shlex.quote(log_dir)
    events = any(n.startswith("events.out.tfevents") for n in os.listdir(log_dir))
    commands = ([f"`tensorboard --logdir {folder}`"] if events or traces else []) + [
        f"`lightning-perf report {folder}`"
    ]
    files = ", ".join(names) if names else "no file (see the warnings above)"
    return f"lightning-perf: run folder {log_dir}: {files}; open with {' or '.join(commands)}"


def traces_phrase(traces: list[str], trace_ranks: list[int], rank: int) -> str:
    """This rank's traces, and in a multi-rank job the ranks whose traces sit beside them (each rank writes its
    own, possibly after this line is printed)."""
    listed = f"{', '.join(traces[:2])}{', ...' if len(traces) > 2 else ''}"
    count = f"{len(traces)} trace{'s' if len(traces) != 1 else ''}"
    if len(trace_ranks) <= 1:
        return f"{count} ({listed})"
    ranks = ", ".join(map(str, trace_ranks[:8])) + (", ..." if len(trace_ranks) > 8 else "")
    if not traces:
        return f"the traces of ranks {ranks} (rank {rank} records none)"
    return f"{count} from each of ranks {ranks} (rank {rank}'s: {listed})"


def _safely(what: str, job: Any) -> bool:
    """Run ``job``; on an error one warning names what was lost and why. True when it ran through."""
    try:
        job()
    except Exception as err:  # the run's own outcome wins
        reason = describe_os_error(err) if isinstance(err, OSError) else err
        log.warning(f"lightning-perf: could not {what}: {reason}")
        return False
    return True


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
    """Summarise, diagnose and write what one run measured. Never raises: the run's own outcome wins.

    ``reducer`` is given only when every rank gets here the same way (a rank that raised calls no collective).
    The num_workers probe comes after, in :func:`probe_and_update`, so that nothing measured waits on it.
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
        handoff_loader = handoff_plan(trainer, summary, config)
        if (
            handoff_loader is not None
        ):  # an input-bound fit: what a worker's hand-off costs, before any advice
            measure_handoff(summary, handoff_loader)
        plan = probe_plan(trainer, summary, config)
        if diagnosed(trainer, summary, config):
            diagnose_run(summary)
        probe_follows = plan is not None and plan[1] is not None
    except Exception as err:
        log.warning(f"lightning-perf: could not complete the run summary: {err}")
        return None
    if probe_follows:  # one answer per run: the findings are shown once, after the probe (probe_and_update)
        _save(summary, log_dir)
    elif trainer.is_global_zero:
        write(trainer, summary, config, log_dir=log_dir, hp_placeholder=hp_placeholder)
    return summary


def finish(
    trainer: Trainer, summary: RunSummary, config: PerfConfig, *, log_dir: str | None, hp_placeholder: bool
) -> None:
    """After :func:`complete`: the num_workers probe when one follows (:func:`probe_and_update`), then, last of
    all a fit prints, the line naming its folder, its files and the commands that open them."""
    try:
        probe_and_update(trainer, summary, config, log_dir=log_dir, hp_placeholder=hp_placeholder)
    finally:
        if summary.stage == "fit" and trainer.is_global_zero:
            _safely("name the run folder", lambda: _log_where(summary, log_dir))


def _log_where(summary: RunSummary, log_dir: str | None) -> None:
    line = where_line(summary, log_dir)
    if line:
        log.info(line)


def probe_and_update(
    trainer: Trainer, summary: RunSummary, config: PerfConfig, *, log_dir: str | None, hp_placeholder: bool
) -> None:
    """After a finished fit's summary is saved: the num_workers probe, the diagnosis again with its result, then
    the one diagnosis of the run shown and written (:func:`write`). ``KeyboardInterrupt`` shows and writes what
    training measured, then propagates; an error in the probe warns and does the same."""
    try:
        plan = probe_plan(trainer, summary, config)
    except Exception as err:
        log.warning(f"lightning-perf: could not plan the num_workers probe: {err}")
        return
    if plan is None:
        return  # complete() wrote everything already
    dataloader, budget = plan
    if budget is None:  # complete() wrote everything already
        log.info(
            f"lightning-perf: num_workers probe skipped: the fit trained {summary.timing.train_wall_s:.1f} s, "
            "too short for a measured verdict (probe_num_workers='always' forces it)"
        )
        return

    def publish() -> None:
        write(trainer, summary, config, log_dir=log_dir, hp_placeholder=hp_placeholder)

    try:
        probe_num_workers(summary, dataloader, budget)
        diagnose_run(summary)
    except KeyboardInterrupt:
        log.info(f"lightning-perf: probes interrupted; {SUMMARY_FILENAME} keeps what training measured")
        publish()
        raise
    except Exception as err:
        log.warning(f"lightning-perf: a measured probe failed: {err}")
        summary.probes.pop("num_workers", None)
        publish()
        return
    publish()
    _safely(
        "log the num_workers probe",
        lambda: tensorboard.log_num_workers_probe(trainer, summary.probes["num_workers"]),
    )
