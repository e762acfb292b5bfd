"""What happens when a run ends, in order: measure, probe, diagnose, write.

The callback hands over a :class:`RunEnd` after the last step (outside any timed step); :func:`finish_run`
does the rest, each step in its own module:

1. **measure** (:mod:`lightning_perf.run_end.measure`): the summary of what training measured, the rank table,
   the MFU, the cudnn.benchmark A/B (on every rank: all together, or none) and a worker's hand-off of a batch.
2. **plan** the num_workers probe (:mod:`lightning_perf.run_end.probing`), and **diagnose** what was measured
   (rank zero of a fit).
3. **write** (:mod:`lightning_perf.output.end_of_run`): without a probe to follow, the summary, the diagnosis,
   the trace chart, HParams and the other loggers, on rank zero. With one, the summary alone is saved first, so
   an interrupt or a kill during the probe loses nothing measured; then
4. **probe**, diagnose again with its result, and write: the findings are shown once per run, after the probe.
5. the line naming the run's folder, its files and the commands that open them: last of all a fit prints.

Nothing here raises but a ``KeyboardInterrupt`` in the probe, after what training measured is written: the
run's own outcome wins.
"""

from __future__ import annotations

from lightning_perf import console
from lightning_perf.analysis.summary import SUMMARY_FILENAME, RunSummary
from lightning_perf.output import loggers, trace_findings
from lightning_perf.output.end_of_run import log_where, safely, save, short_run_message, write
from lightning_perf.run_end.context import RunEnd
from lightning_perf.run_end.measure import measure
from lightning_perf.run_end.probing import ProbePlan, diagnosed, probe_num_workers, probe_plan

log = console.logger(__name__)


def finish_run(end: RunEnd) -> RunSummary | None:
    """Measure, probe, diagnose and write the run that ended (the module's docstring has the steps); its
    summary, or None when it could not be measured."""
    trainer = end.trainer
    try:
        summary = measure(end)
        plan = probe_plan(trainer, summary, end.config)
        diagnose_run(end, summary)  # what training measured: written now, or saved before the probe
    except Exception as err:
        log.warning(f"lightning-perf: could not complete the run summary: {err}")
        summary, plan = None, None
    end.summary = summary
    if summary is not None:
        if plan is not None and plan.budget_s is not None:
            save(summary, end.log_dir)  # one answer per run: the findings are shown once, after the probe
        elif trainer.is_global_zero:
            _write(end, summary)
    if end.status == "finished" and (message := short_run_message(end.config.schedule, end.session)):
        log.info(message)
    if summary is None:
        return None
    try:
        if plan is not None:
            _probe_and_write(end, summary, plan)
    finally:
        if summary.stage == "fit" and trainer.is_global_zero:
            safely("name the run folder", lambda: log_where(summary, end.log_dir))
    return summary


def diagnose_run(end: RunEnd, summary: RunSummary) -> None:
    """The summary's own findings and those of its CUDA traces, on the rank that diagnoses. Run on what training
    measured, and again after a num_workers probe with its result (the summary saved before the probe carries
    the findings of what was measured, for a run killed during the probe)."""
    from lightning_perf.analysis.diagnosis import diagnose

    if diagnosed(end.trainer, summary, end.config):
        summary.findings = diagnose(summary)
        summary.findings = trace_findings.with_trace_findings(summary)


def _probe_and_write(end: RunEnd, summary: RunSummary, plan: ProbePlan) -> None:
    """After a finished fit's summary is saved: the num_workers probe, the diagnosis again with its result, then
    the one diagnosis of the run shown and written. ``KeyboardInterrupt`` shows and writes what training
    measured, then propagates; an error in the probe warns and does the same."""
    if plan.budget_s is None:  # the findings are written already
        log.info(
            f"lightning-perf: num_workers probe skipped: the fit trained {summary.timing.train_wall_s:.1f} s, "
            "too short for a measured verdict (probe_num_workers='always' forces it)"
        )
        return
    try:
        probe_num_workers(summary, plan.dataloader, plan.budget_s)
        diagnose_run(end, summary)
    except KeyboardInterrupt:
        log.info(f"lightning-perf: probes interrupted; {SUMMARY_FILENAME} keeps what training measured")
        _write(end, summary)
        raise
    except Exception as err:
        log.warning(f"lightning-perf: a measured probe failed: {err}")
        summary.probes.num_workers = None
        _write(end, summary)
        return
    _write(end, summary)
    probe = summary.probes.num_workers
    if probe is not None:
        safely("log the num_workers probe", lambda: loggers.log_num_workers_probe(end.trainer, probe))


def _write(end: RunEnd, summary: RunSummary) -> None:
    write(end.trainer, summary, end.config, log_dir=end.log_dir, hp_placeholder=end.hp_placeholder)
