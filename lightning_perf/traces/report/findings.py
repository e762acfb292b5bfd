"""The findings of a report as JSON, and the run summary's findings beside its traces."""

from __future__ import annotations

from typing import Any

from lightning_perf.analysis.rules.trace import types_say_half
from lightning_perf.analysis.summary import Finding, RunSummary

FINDING_KEYS = ("id", "severity", "title", "evidence", "recommendation", "settings_change")


def finding_dict(finding: Finding) -> dict[str, Any]:
    return {key: getattr(finding, key) for key in FINDING_KEYS}


def summary_findings(summary: RunSummary, sections: list[dict[str, Any]]) -> list[Finding]:
    """The summary's findings, less its precision advice where it was made from settings that read full
    precision and the traces' input types show the work in half precision (a summary written before the traces
    were read with types, or by an older version); kept where a trace advises a change itself."""
    advised = any(f["id"] == "mixed_precision" for s in sections for f in s["findings"])
    eligible_by = (s["figures"].get("tc_eligible_by") for s in sections)
    if advised or not types_say_half(summary.settings, eligible_by):
        return summary.findings
    return [f for f in summary.findings if f.id != "mixed_precision"]
