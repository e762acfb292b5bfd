"""A trial's report as text or markdown, and the rounds the machine's other work disturbed.

Takes a :class:`~lightning_perf.trial.spec.TrialResult` (and its variants) by their fields; ``spec`` imports
this module, never the other way round.
"""

from __future__ import annotations

from typing import Any

from lightning_perf.analysis.verdicts.comparison_render import render_markdown, render_text
from lightning_perf.trial import runner
from lightning_perf.trial.compute.figures import figures_lines


def disturbed_rounds(variant: Any) -> list[tuple[int, str]]:
    """(round number from 1, what else used the machine) for each of a variant's rounds that was disturbed:
    as the worker reported it (``variant.round_reports``), else as the round's summary shows it."""
    reports = list(getattr(variant, "round_reports", []))
    rounds = list(variant.rounds)
    found = []
    for i in range(max(len(reports), len(rounds))):
        text = reports[i].disturbed if i < len(reports) else None
        if not text and i < len(rounds):
            text = runner.disturbance(rounds[i])  # through the module: tests replace it
        if text:
            found.append((i + 1, text))
    return found


def disturbance_notes(variants: Any) -> list[str]:
    """One note a disturbed round: ``round 2 of baseline was disturbed: other processes used ...``."""
    return [
        f"round {number} of {v.name} was disturbed: {text}"
        for v in variants
        for number, text in disturbed_rounds(v)
    ]


def trial_plan(result: Any) -> str:
    """How the trial measured: its variants, rounds and steps, on one line."""
    variants = result.variants
    order = " ".join(v.name for v in variants[:3]) + (" ..." if len(variants) > 3 else "")
    rounds = (
        f"{result.repeats} interleaved rounds ({order}, the order rotated each round)"
        if result.repeats > 1
        else "one round"
    )
    return (
        f"trial {result.name}: {len(variants)} variants x {rounds}, {result.steps} timed steps each after "
        f"{result.warmup_steps} warm-up steps"
    )


def render_trial(result: Any, fmt: str = "text") -> str:
    """The report: how it was measured, notes (disturbed rounds among them), the comparison table and the
    failed variants."""
    markdown = fmt == "markdown"
    plan = trial_plan(result)
    lines = [f"> {plan}" if markdown else plan]
    notes = [*result.all_notes, *disturbance_notes(result.variants)]
    lines += [f"> note: {n}" if markdown else f"note: {n}" for n in notes]
    lines.append("")
    text = "\n".join(lines)
    if result.comparison is not None:
        text += render_markdown(result.comparison) if markdown else render_text(result.comparison)
    figures = figures_lines(result)  # the loss beside the speed: a change of numerics still trains
    if figures:
        text += "\n" + "\n".join(f"{line}\n" if markdown else line for line in figures) + "\n"
    failed = result.failed
    if failed:
        title = "**Failed variants (not compared):**" if markdown else "failed variants (not compared):"
        rows = [title]
        for v in failed:
            log = f" (log: {v.log_path})" if v.log_path else ""
            rows.append(f"- `{v.name}`: {v.error}{log}" if markdown else f"  {v.name}: {v.error}{log}")
        text += "\n" + "\n".join(rows) + "\n"
    return text
