"""Diagnosis: pure rules that turn a :class:`RunSummary` into :class:`Finding` s.

Every rule reads only the summary, states its evidence with the measured numbers, recommends one change
in one sentence and gives that change as data (``Finding.settings_change``) so a later step can try it.
A rule whose evidence is absent (``None``) stays silent: it never guesses with zeros. When timing data
exists the input-bound verdict is always reported, even when it is "not input-bound"; a run with fewer timed steps
than ``MIN_STEPS_FOR_VERDICT`` gets no grade at all but "too short for a verdict" with what it measured.

The findings are rendered for people by :mod:`lightning_perf.analysis.findings_render`. This module imports nothing
from Lightning or torch.
"""

from __future__ import annotations

import dataclasses

from lightning_perf.analysis.compute import mfu_rules, step_rules
from lightning_perf.analysis.gpu_measures import input_wait
from lightning_perf.analysis.numbers import finite
from lightning_perf.analysis.rules import compile as rules_compile
from lightning_perf.analysis.rules import device as rules_device
from lightning_perf.analysis.rules import memory as rules_memory
from lightning_perf.analysis.rules import noise as rules_noise
from lightning_perf.analysis.rules import run as rules_run
from lightning_perf.analysis.rules import slowdown as rules_slowdown
from lightning_perf.analysis.rules.inputs import pipeline as rules_pipeline
from lightning_perf.analysis.rules.inputs import waiting as rules_input
from lightning_perf.analysis.rules.thresholds import SETTING_TARGETS, SEVERITY_ORDER
from lightning_perf.analysis.summary import Finding, RunSummary
from lightning_perf.errors import ConfigError

# Rule order within one severity is the order findings are shown in.
RULES = (
    # first: when others hold the cores it leads (high), before what the run's CPU figures seem to say
    rules_noise.noisy_machine,
    rules_input.input_bound,
    rules_slowdown.slowdown,
    rules_pipeline.batched_transforms,
    rules_input.pin_memory,
    rules_input.persistent_workers,
    rules_input.prefetch_factor,
    rules_device.cudnn_benchmark,
    rules_device.low_gpu_util,
    rules_device.mixed_precision,
    mfu_rules.low_mfu,
    rules_run.validation_share,
    rules_run.checkpoint_share,
    rules_input.workers_exceed_cores,
    rules_input.workers_saturated,
    rules_run.straggler,
    rules_run.collective_wait,
    rules_memory.memory_growth,
    rules_compile.recompilation,
    rules_compile.graph_breaks,
    step_rules.lightning_overhead,
    step_rules.optimizer_share,
    step_rules.module_hotspot,
)

__all__ = ["RULES", "SETTING_TARGETS", "diagnose", "input_bound_verdict"]


def diagnose(summary: RunSummary) -> list[Finding]:
    """Diagnose a finished run: every rule over its summary, advice that does not contradict itself.

    Args:
        summary: the run's summary, as ``PerfCallback`` writes it (``perf_summary.json``, read with
            ``RunSummary.from_dict``).

    Returns:
        The findings, most severe first (rule order within one severity); empty when no rule has evidence.

    Raises:
        ConfigError: ``summary`` is not a :class:`RunSummary`.
    """
    if not isinstance(summary, RunSummary):
        raise ConfigError(f"summary: expected a RunSummary, got {type(summary).__name__}")
    verdict = input_bound_verdict(input_wait(summary).value)
    # a run too short for a verdict: the input-bound rule says so, and no other rule leans on a grade
    graded = None if rules_input.too_short(summary) else verdict
    findings: list[Finding] = []
    for rule in RULES:
        finding = rule(summary, verdict if rule is rules_input.input_bound else graded)
        if finding is not None:
            findings.append(finding)
    findings = _one_voice(findings, summary)
    return sorted(findings, key=lambda f: SEVERITY_ORDER.index(f.severity))


def _one_voice(findings: list[Finding], summary: RunSummary) -> list[Finding]:
    """Advice that does not contradict itself: when the input pipeline is CPU-bound in a way more workers
    cannot fix (``batched_transforms``), the input-bound finding does not also ask for more workers, except a
    first worker for a run with none: with 0 workers loading never overlaps the step. Fewer workers stay: the
    workers may be saturated by the hand-off itself (large batches), which fewer workers save."""
    current = summary.settings.num_workers
    if current == 0 or not any(f.id == "batched_transforms" for f in findings):
        return findings
    return [
        dataclasses.replace(
            f,
            recommendation="More workers will not help here (see the batched-transforms finding): take the "
            "per-sample work off the CPU.",
            settings_change={},
        )
        if f.id == "input_bound" and (current is None or f.settings_change.get("num_workers", -1) > current)
        else f
        for f in findings
    ]


def input_bound_verdict(data_wait_pct: float | None) -> str | None:
    """TensorFlow's grade for a data-wait share in percent; ``None`` when the share was not measured."""
    pct = finite(data_wait_pct)
    return None if pct is None else rules_input.wait_share_grade(pct)
