"""What ``tune`` found, tried and decided (:class:`TuneResult`), as text and as JSON."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from lightning_perf.analysis.summary import Finding
from lightning_perf.trial.compute.figures import RoundFigures, beside
from lightning_perf.trial.decision import METHOD, Decision, Speed
from lightning_perf.trial.project.terms import InProjectTerms
from lightning_perf.trial.proposals import Candidate, Unapplied
from lightning_perf.trial.rendering import disturbance_notes
from lightning_perf.trial.spec import TrialResult
from lightning_perf.tune.diagnosis import DIAGNOSIS

TUNE_SCHEMA_NAME = "lightning-perf/tune"
TUNE_SCHEMA_VERSION = 1
BASELINE = "baseline"


@dataclass
class TuneResult:
    """What ``tune`` found, tried and decided. ``decision.winner`` is a candidate's name or None (keep)."""

    config: str
    experiment_dir: str
    findings: list[Finding] = field(default_factory=list)
    candidates: list[Candidate] = field(default_factory=list)
    unapplied: list[Unapplied] = field(default_factory=list)
    speeds: list[Speed] = field(default_factory=list)
    decision: Decision = field(default_factory=lambda: Decision(None, "no verdict", judged=False))
    trial: TrialResult | None = None
    tuned_path: str | None = None
    diff: str = ""
    notes: list[str] = field(default_factory=list)
    rounds: int = 0
    diagnosis_error: str | None = None
    method: str = METHOD  # METHOD_PER_SAMPLE when the variants differ in batch size
    # the tuned config was chosen but could not be written (path and errno): the command fails
    write_error: str | None = None
    # the winner in the project's terms: the tuned config, Hydra overrides and group file, or lines of code
    in_project: InProjectTerms | None = None
    # each variant's mean training loss and compile time over its rounds, shown beside its speed
    figures: dict[str, RoundFigures] = field(default_factory=dict)

    def render(self) -> str:
        lines = [f"tune {self.config}: diagnosis under {os.path.join(self.experiment_dir, DIAGNOSIS)}"]
        if self.diagnosis_error:
            lines.append(f"  the diagnosis fit failed: {self.diagnosis_error}")
        for f in self.findings:
            lines.append(f"  [{f.severity}] {f.id}: {f.title}")
        if self.candidates:
            lines.append("candidates:")
            lines += [
                f"  {c.label}" + (f"  (from {', '.join(c.findings)})" if c.findings else "")
                for c in self.candidates
            ]
        if self.unapplied:
            lines.append("not tried:")
            lines += [f"  {u.finding} ({u.reason}): {u.recommendation}" for u in self.unapplied]
        if self.trial is not None:
            lines.append(self.trial.plan().replace(f"trial {self.trial.name}", "measured"))
            logs = {v.name: v.log_path for v in self.trial.variants if not v.ok and v.log_path}
            lines += [
                f"  {s.describe()}{beside(self.figures, s.name, BASELINE)}"
                + (f" (log: {logs[s.name]})" if s.name in logs else "")
                for s in self.speeds
            ]
            lines.append(f"  method: {self.method}")
        trial_notes = [*self.trial.all_notes, *disturbance_notes(self.trial.variants)] if self.trial else []
        lines += [f"note: {n}" for n in [*self.notes, *trial_notes]]
        lines.append(f"verdict: {self.decision.line}")
        if self.write_error:
            lines.append(f"error: {self.write_error}")
        if self.tuned_path:
            lines.append(f"wrote {self.tuned_path} (your config is unchanged):")
            lines.append(self.diff.rstrip("\n"))
        others = [
            line
            for line in (self.in_project.lines if self.in_project else [])
            if not self.tuned_path or self.tuned_path not in line
        ]
        if others:
            lines.append("set the winner in your project (your files are unchanged):")
            lines += [f"  {line}" for line in others]
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": TUNE_SCHEMA_NAME,
            "schema_version": TUNE_SCHEMA_VERSION,
            "config": self.config,
            "experiment_dir": self.experiment_dir,
            "diagnosis_error": self.diagnosis_error,
            "findings": [{"id": f.id, "severity": f.severity, "title": f.title} for f in self.findings],
            "candidates": [c.to_dict() for c in self.candidates],
            "not_tried": [u.to_dict() for u in self.unapplied],
            "rounds": self.rounds,
            "speeds": [s.to_dict() for s in self.speeds],
            "figures": {name: f.to_dict() for name, f in self.figures.items()},
            "method": self.method,
            "decision": {
                "winner": self.decision.winner,
                "line": self.decision.line,
                "judged": self.decision.judged,
            },
            "tuned_config": self.tuned_path,
            "write_error": self.write_error,
            "diff": self.diff,
            "in_project": self.in_project.to_dict() if self.in_project else None,
            "notes": list(self.notes),
            "trial": self.trial.to_dict() if self.trial is not None else None,
        }
