"""Diagnosis rendering: the Markdown report for TensorBoard's Text tab and the end-of-fit console block.

:func:`render_markdown` and :func:`render_console` turn the :class:`Finding` s of
:func:`lightning_perf.analysis.diagnosis.diagnose` (and the run's key figures) into text; the rules themselves stay in
:mod:`lightning_perf.analysis.diagnosis`. Pure string formatting: this module imports nothing from Lightning or torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_perf.analysis.numbers import finite as _num
from lightning_perf.analysis.numbers import fmt1 as _fmt
from lightning_perf.analysis.summary import Finding, RunSummary
from lightning_perf.analysis.thresholds import VERDICTS


def render_markdown(findings: Sequence[Finding], summary: RunSummary) -> str:
    """The report for TensorBoard's Text tab: heading, verdict, key figures and a table of findings."""
    lines = [f"## lightning-perf diagnosis{': ' + summary.run_name if summary.run_name else ''}", ""]
    verdict = next((f for f in findings if f.id == "input_bound"), None)
    if verdict is not None:
        lines.append(f"**Verdict: {_verdict_text(verdict)}.** {verdict.evidence}")
    else:
        lines.append("**Verdict: unknown** (no DataLoader timing was measured).")
    figures = _key_figures(summary)
    if figures:
        lines += ["", figures]
    lines.append("")
    # the "not input-bound" finding is the verdict line already; everything else goes in the table
    actionable = [f for f in findings if not (f.id == "input_bound" and f.severity == "info")]
    if not actionable:
        lines.append("No other findings: nothing to change.")
        return "\n".join(lines) + "\n"
    lines += [
        "| Severity | Finding | Evidence | Recommendation | Settings change |",
        "|---|---|---|---|---|",
    ]
    for f in actionable:
        cells = (f.severity, f.title, f.evidence, f.recommendation, _change_text(f.settings_change) or "-")
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def render_console(findings: Sequence[Finding], max_lines: int = 5) -> str:
    """A compact block for the end of fit: the verdict, then the most severe findings and their change."""
    verdict = next((f for f in findings if f.id == "input_bound"), None)
    head = "lightning-perf: " + (
        f"{_verdict_text(verdict)} - {verdict.evidence}" if verdict else "no timing data"
    )
    lines = [head]
    actionable = [f for f in findings if f.severity != "info"]
    for f in actionable[:max_lines]:
        change = _change_text(f.settings_change)
        lines.append(f"  [{f.severity}] {f.title}: " + (f"set {change}" if change else f.recommendation))
    if len(actionable) > max_lines:
        lines.append(f"  ... {len(actionable) - max_lines} more in perf_summary.json / TensorBoard Text tab")
    return "\n".join(lines)


def _verdict_text(finding: Finding) -> str:
    return next((v for v in VERDICTS if v in finding.title), finding.title)


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


def _change_text(change: dict[str, Any]) -> str:
    return ", ".join(f"`{k}={v!r}`" for k, v in change.items())


def _cell(text: str) -> str:
    # a pipe or newline would break the Markdown table row
    return text.replace("|", "\\|").replace("\n", " ")
