"""The GPU side of the end of fit: what the run's own CUDA traces show, added to its summary and diagnosis.

After the last step, every saved cycle with CUDA activity is read once, streamed, by the typed reader of
``report`` (about 1.7-3 s per 100 MB of uncompressed trace on one loaded core, see benchmarks/README.md): its
:class:`~lightning_perf.analysis.trace_figures.TraceFigures` go into the summary, its kernel-busy shares (all
kernels, and compute kernels only) are logged at the step the cycle was recorded, its findings
(:mod:`lightning_perf.analysis.rules.trace`) join the diagnosis, and the chart goes to TensorBoard's Images tab.
A trace that cannot be read costs one warning, never the run.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import statistics
from typing import Any

from lightning_perf.analysis import metrics
from lightning_perf.analysis.rules import cross_rank
from lightning_perf.analysis.rules.thresholds import SEVERITY_ORDER
from lightning_perf.analysis.rules.trace import diagnose_trace, settings_advice_superseded
from lightning_perf.analysis.summary import Finding, GpuUtilization, RunSummary
from lightning_perf.analysis.trace_figures import TopOperator, TraceFigures
from lightning_perf.output import loggers as tensorboard

# operators and kernels kept in the summary for the end of fit's answer (the report lists its own --top)
TOP_OPERATORS = 5
KERNEL_BUSY_PCT = metrics.KERNEL_BUSY.tag
COMPUTE_BUSY_PCT = metrics.COMPUTE_BUSY.tag
CHART_TAG = metrics.TRACE_CHART.tag

log = logging.getLogger("lightning_perf")


def read_cycles(trainer: Any, cycles: list[tuple[str, int]], summary: RunSummary) -> None:
    """Figures of each ``(trace path, global step)`` into ``summary``; busy shares logged (fit only)."""
    from lightning_perf.traces.figures.gpu_figures import trace_figures
    from lightning_perf.traces.read.loader import load_trace

    for path, step in cycles:
        try:
            parsed = load_trace(path)
            figures = trace_figures(parsed)
            with_top_operators(figures, parsed.columns)  # the columns: no span tuples made
        except Exception as err:
            log.warning("lightning-perf: could not read kernel activity from %s: %s", path, err)
            continue
        figures.source = os.path.basename(path)
        summary.trace_figures.append(figures)
        pcts = {KERNEL_BUSY_PCT: figures.kernel_busy_pct, COMPUTE_BUSY_PCT: figures.compute_busy_pct}
        metrics = {tag: value for tag, value in pcts.items() if value is not None}
        if summary.stage == "fit":
            tensorboard.log_metrics(trainer, metrics, step)
    busy = [f.kernel_busy_pct for f in summary.trace_figures if f.kernel_busy_pct is not None]
    if busy:
        gpu = summary.utilization.gpu or GpuUtilization()
        gpu.kernel_busy_pct = statistics.fmean(busy)
        gpu.compute_busy_pct = statistics.fmean(
            f.compute_busy_pct for f in summary.trace_figures if f.compute_busy_pct is not None
        )
        summary.utilization.gpu = gpu


def with_top_operators(figures: TraceFigures, spans: Any) -> None:
    """The trace's host operators by self CPU time and GPU kernels by time, per profiled step, into ``figures``."""
    from lightning_perf.traces.figures.analysis import cpu_operator_stats, kernel_stats
    from lightning_perf.traces.figures.modules import module_times

    steps = max(figures.steps, 1)

    def top(stats: Any) -> list[TopOperator]:
        return [TopOperator(s.name, s.calls, s.self_us / 1e3 / steps) for s in stats[:TOP_OPERATORS]]

    figures.top_operators = top(cpu_operator_stats(spans))
    figures.top_kernels = top(kernel_stats(spans))
    figures.modules = module_times(spans, steps)


def with_trace_findings(summary: RunSummary) -> list[Finding]:
    """The summary's findings with those of its traces: per id the most severe (a trace finding wins a tie:
    it carries the trace's numbers); the trace's input verdict only when the summary has none."""
    merged = {f.id: f for f in summary.findings}
    measured_input = summary.timing.data_wait_pct is not None
    rows = cross_rank.rows_from_stats(summary.ranks)
    waiting, straggler = cross_rank.waiting_ranks(rows), cross_rank.find_straggler(rows)
    for figures in summary.trace_figures:
        findings = diagnose_trace(figures, settings=summary.settings)
        if straggler is not None and summary.global_rank in waiting:  # waiting for it is no problem of ours
            row = cross_rank.RankRow(
                rank=summary.global_rank,
                step_ms=figures.step_ms,
                exposed_comm_ms=figures.exposed_communication_ms_per_step,
            )
            findings = cross_rank.without_own_communication(
                findings, row, waiting[summary.global_rank], straggler.rank
            )
        for finding in findings:
            if finding.id == "input_bound" and measured_input:
                continue
            old = merged.get(finding.id)
            if old is None or SEVERITY_ORDER.index(finding.severity) <= SEVERITY_ORDER.index(old.severity):
                merged[finding.id] = finding
    # the traces' input types say what the operators computed, where the settings only say what was asked
    if settings_advice_superseded(summary.trace_figures, summary.settings):
        merged.pop("mixed_precision", None)
    return sorted(merged.values(), key=lambda f: SEVERITY_ORDER.index(f.severity))


def log_chart(trainer: Any, summary: RunSummary) -> None:
    """The per-step breakdown and GPU timeline of the run's traces in TensorBoard's Images tab."""
    logger = tensorboard.tensorboard_logger(trainer)
    if logger is None or not trainer.is_global_zero or not summary.trace_figures:
        return
    try:
        from lightning_perf.output.trace_chart import chart_rgb

        sections = [
            (f.source or f"cycle {i + 1}", dataclasses.asdict(f)) for i, f in enumerate(summary.trace_figures)
        ]
        logger.experiment.add_image(CHART_TAG, chart_rgb(sections), trainer.global_step, dataformats="HWC")
        logger.experiment.flush()
    except Exception as err:
        log.warning("lightning-perf: could not log the trace chart: %s", err)
