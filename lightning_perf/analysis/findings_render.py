"""Diagnosis rendering: the Markdown report for TensorBoard's Text tab and the end-of-fit console block.

:func:`render_markdown` and :func:`render_console` turn the :class:`Finding` s of
:func:`lightning_perf.analysis.diagnosis.diagnose` (and the run's key figures) into text, and
:func:`render_probe_markdown` the num_workers probe into a table; the rules themselves stay in
:mod:`lightning_perf.analysis.diagnosis`. Pure formatting (the console table is drawn by rich): nothing from
Lightning or torch.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from lightning_perf.analysis import markdown
from lightning_perf.analysis.compute.anatomy_text import (
    anatomy_lines,
    anatomy_markdown,
    module_lines,
    module_markdown,
)
from lightning_perf.analysis.compute.limit import mfu_line
from lightning_perf.analysis.numbers import finite as _num
from lightning_perf.analysis.numbers import fmt1 as _fmt
from lightning_perf.analysis.probe_results import NumWorkersProbe
from lightning_perf.analysis.rules.helpers import change_text
from lightning_perf.analysis.rules.inputs.waiting import verdict_of
from lightning_perf.analysis.rules.thresholds import ARGUMENT_TARGETS, SETTING_TARGETS, VERDICTS
from lightning_perf.analysis.summary import Finding, RunSummary


def render_markdown(findings: Sequence[Finding], summary: RunSummary) -> str:
    """The report for TensorBoard's Text tab: heading, verdict, key figures and a table of findings."""
    lines = [f"## lightning-perf diagnosis{': ' + summary.run_name if summary.run_name else ''}", ""]
    verdict = next((f for f in findings if f.id == "input_bound"), None)
    if verdict is not None:
        lines.append(f"**Verdict: {verdict_of(verdict)}.** {verdict.evidence}")
    else:
        lines.append("**Verdict: unknown** (no DataLoader timing was measured).")
    figures = _key_figures(summary)
    if figures:
        lines += ["", figures]
    compute = mfu_line(summary.compute_limit) if summary.compute_limit is not None else None
    lines += ["", f"Compute: {compute}."] if compute else []
    lines.append("")
    # the "not input-bound" finding is the verdict line already; everything else goes in the table
    actionable = [f for f in findings if not (f.id == "input_bound" and f.severity == "info")]
    if not actionable:
        lines.append("No other findings: nothing to change.")
        return "\n".join(lines) + "\n"
    header = ["Severity", "Finding", "Evidence", "Recommendation", "Settings change"]
    rows = [
        [f.severity, f.title, f.evidence, f.recommendation, change_text(f.settings_change) or "-"]
        for f in actionable
    ]
    lines += markdown.table(header, rows)
    return "\n".join(lines) + "\n"


# the console table's width: wide enough for a finding's title and its settings change on one line each
CONSOLE_WIDTH = 110


def render_console(findings: Sequence[Finding], max_lines: int = 5, head: str | None = None) -> str:
    """A compact block for the end of fit: the verdict (or ``head``), then a table of the most severe findings."""
    verdict = next((f for f in findings if f.id == "input_bound"), None)
    if head is None:
        head = "lightning-perf: " + (
            f"{verdict_of(verdict)} - {verdict.evidence}" if verdict else "no timing data"
        )
    actionable = [f for f in findings if f.severity != "info"]
    if not actionable:
        return head
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, caption_justify="left")
    for column in ("severity", "finding", "what to do"):
        table.add_column(column, overflow="fold")
    for f in actionable[:max_lines]:
        change = change_text(f.settings_change)
        # a recipe or a compute setting (code to write: batched transforms, torch.compile) is no argument to
        # "set": say what to do
        code = any(SETTING_TARGETS.get(key) not in ARGUMENT_TARGETS for key in f.settings_change)
        table.add_row(f.severity, f.title, f"set {change}" if change and not code else f.recommendation)
    if len(actionable) > max_lines:
        table.caption = f"{len(actionable) - max_lines} more in perf_summary.json and TensorBoard's Text tab"
    return head + "\n" + _plain_text(table)


def render_probe_markdown(probe: NumWorkersProbe) -> str:
    """The num_workers probe as a Markdown table: delivered batches/s per num_workers, the model's rate."""
    rows = []
    for candidate in probe.candidates:
        rows.append(
            [
                str(candidate.get("num_workers")),
                _fmt(_num(candidate.get("batches_per_sec"))),
                _fmt(_num(candidate.get("startup_ms"))),
                str(candidate.get("error") or ""),
            ]
        )
    lines = ["## lightning-perf num_workers probe", ""]
    lines += markdown.table(
        ["num_workers", "batches/s", "start-up (ms)", "error"], rows, right_aligned={0, 1, 2}
    )
    compute = _num(probe.compute_batches_per_sec)
    lines += ["", f"The model computes {_fmt(compute)} batches/s."] if compute is not None else []
    if probe.suggested is not None:
        lines += ["", f"Suggested: `num_workers={probe.suggested}`. {probe.reason}".rstrip()]
    return "\n".join(lines) + "\n"


def _plain_text(renderable: Any) -> str:
    """What rich prints, as plain text (no colours): the block goes through logging, not straight to a tty."""
    text = io.StringIO()
    Console(file=text, width=CONSOLE_WIDTH, color_system=None, highlight=False).print(renderable)
    return "\n".join(line.rstrip() for line in text.getvalue().splitlines()).rstrip("\n")


def _key_figures(summary: RunSummary) -> str:
    timing, parts = summary.timing, []
    if timing.step_time_ms is not None:
        parts.append(f"median step {_fmt(timing.step_time_ms.median)} ms")
    if _num(timing.samples_per_sec) is not None:
        parts.append(f"{_fmt(timing.samples_per_sec)} samples/s")
    gpu = summary.utilization.gpu
    if gpu is not None and _num(gpu.util_pct) is not None:
        parts.append(f"GPU utilization {_fmt(gpu.util_pct)}%")
    return ("Run: " + ", ".join(parts) + ".") if parts else ""


# -- the end of fit's answer: verdict, where the time went, what applies -----------------------------------
# the profiled step's operators shown on the console (the summary keeps a few more, the report --top N)
ANSWER_OPERATORS = 5
_NAME_CHARS = 70  # a templated CUDA kernel name runs to hundreds of characters


def render_answer(findings: Sequence[Finding], summary: RunSummary, no_trace: str | None = None) -> str:
    """The end of fit on the console, one block: the verdict line; unless the run is highly input-bound, the
    operators of its recorded profiler cycle (or ``no_trace``, why there is none); then the findings that apply
    as one table, or the reason none does."""
    verdict = next((f for f in findings if f.id == "input_bound"), None)
    head = [
        "lightning-perf: " + (f"{verdict_of(verdict)} - {verdict.evidence}" if verdict else "no timing data")
    ]
    compute = mfu_line(summary.compute_limit) if summary.compute_limit is not None else None
    head += [f"lightning-perf: {compute}"] if compute else []
    if verdict is None or verdict_of(verdict) != VERDICTS[0]:
        # the user's code first, the machine's operators after
        head += anatomy_lines(summary.anatomy) + module_lines(summary.trace_figures)
        operators = operator_lines(summary)
        head += operators or ([f"lightning-perf: {no_trace}"] if no_trace else [])
    text = render_console(findings, head="\n".join(head))
    if any(f.severity != "info" for f in findings):
        return text
    return text + "\nlightning-perf: no finding applies: " + no_finding_reason(summary)


def operator_lines(summary: RunSummary) -> list[str]:
    """Where the first recorded cycle's time went: its top operators by self CPU time, and its top GPU kernels
    when it recorded any, each with ms a step and its share of the step. Empty without a read trace."""
    figures = next((f for f in summary.trace_figures if f.top_operators), None)
    if figures is None:
        return []
    numbers = [n for n in figures.step_numbers if n is not None]
    steps = f"steps {numbers[0]}-{numbers[-1]}" if numbers else f"{figures.steps} step(s)"
    lines = [f"lightning-perf: where a profiled step's time went ({steps}, {figures.source or 'trace'}):"]
    for label, top in (("self CPU", figures.top_operators), ("GPU kernel", figures.top_kernels)):
        for op in top[:ANSWER_OPERATORS]:
            share = figures.pct_of_step(op.ms_per_step)
            pct = f" {share:4.0f}%" if share is not None else ""
            lines.append(f"  {label} {op.ms_per_step:8.3f} ms{pct}  {_short(op.name)} ({op.calls} calls)")
    return lines


def no_finding_reason(summary: RunSummary) -> str:
    """Why no rule fired, in the run's terms: what was checked and on what."""
    if not summary.trace_figures:
        return (
            "the run's timing shows nothing to change, and without a trace the operator checks did not run."
        )
    if all(f.kernel_busy_pct is None and not f.top_kernels for f in summary.trace_figures):
        return (
            "the checks for mixed precision, tensor cores, channels-last, small kernels and host syncs read GPU "
            "kernels, and this run recorded none (CPU training): the step is the operators' own compute, listed "
            "above; make them cheaper (a smaller model or batch, or torch.compile) to shorten it."
        )
    return (
        "the recorded cycle shows no idle GPU, host syncs, launch-bound small kernels, pageable copies, exposed "
        "communication or precision to change: the step is the kernels' own time, listed above."
    )


def answer_markdown(findings: Sequence[Finding], summary: RunSummary, no_trace: str | None = None) -> str:
    """:func:`render_markdown`, with the recorded cycle's top operators (or why there is no trace): the text
    of ``perf_diagnosis.md`` and of TensorBoard's Text tab."""
    text = render_markdown(findings, summary) + anatomy_markdown(summary.anatomy)
    text += module_markdown(summary.trace_figures)
    figures = next((f for f in summary.trace_figures if f.top_operators), None)
    if figures is None:
        return text + (f"\n{no_trace[0].upper()}{no_trace[1:]}.\n" if no_trace else "")
    rows = [
        [kind, markdown.code(_short(op.name)), str(op.calls), f"{op.ms_per_step:.3f}"]
        for kind, top in (("CPU (self)", figures.top_operators), ("GPU kernel", figures.top_kernels))
        for op in top[:ANSWER_OPERATORS]
    ]
    lines = ["", f"### Top operators of a profiled step ({figures.source or 'trace'})", ""]
    lines += markdown.table(["Where", "Operator", "Calls", "ms a step"], rows, right_aligned={2, 3})
    return text + "\n".join(lines) + "\n"


def _short(name: str) -> str:
    return name if len(name) <= _NAME_CHARS else name[: _NAME_CHARS - 3] + "..."
