"""The batched-transforms rule on hand-built summaries, at and around its thresholds."""

from __future__ import annotations

import dataclasses
import json

import pytest

from lightning_perf.analysis.diagnosis import SETTING_TARGETS, diagnose
from lightning_perf.analysis.probe_results import NumWorkersProbe, Probes
from lightning_perf.analysis.rules.inputs.pipeline import batched_transforms, per_sample_ms
from lightning_perf.analysis.rules.thresholds import CORES_BUSY_SHARE, PROBE_GAIN_MIN, VERDICTS
from lightning_perf.analysis.summary import Finding, RunSummary
from tests.analysis.test_diagnosis import make

HIGH, MODERATE, NOT_BOUND = VERDICTS


def probe(rates: dict[int, float], suggested: int | None = None) -> Probes:
    candidates = [
        {"num_workers": n, "startup_ms": 1.0, "batches_per_sec": r, "batches": 10, "error": None}
        for n, r in rates.items()
    ]
    return Probes(num_workers=NumWorkersProbe(candidates=candidates, suggested=suggested, reason="r"))


def case_study(**overrides) -> RunSummary:
    """The 2-core CPU case study's 'before' run: 27% wait, 37 ms of data work per batch of 64, 172% CPU."""
    kwargs = dict(
        wait_pct=27.0,
        step_ms=137.0,
        wait_ms=37.0,
        batch_size=64,
        num_workers=0,
        cpu_count=2,
        cpu={"process_cpu_pct": 172.5, "workers_cpu_pct": 0.0},
        probes=probe({0: 27.0, 1: 28.0, 2: 29.0}),
    )
    kwargs.update(overrides)
    return make(**kwargs)


def fire(summary: RunSummary) -> Finding | None:
    return next((f for f in diagnose(summary) if f.id == "batched_transforms"), None)


def test_case_study_before_run_gets_the_named_recipe_with_its_evidence():
    finding = fire(case_study())

    assert finding is not None and finding.severity == "high"
    assert finding.settings_change == {"batched_transforms": True}
    assert SETTING_TARGETS["batched_transforms"] == "LightningModule"
    # per-sample cost from the probe's rate at num_workers=0: 1000 / 27 / 64 ms
    assert f"~{1000 / 27 / 64:.1f} ms of data work per sample" in finding.evidence
    assert "1.07x the delivery rate of num_workers=0" in finding.evidence
    assert "1.7 of 2 usable cores (86.2%" in finding.evidence
    assert "on_after_batch_transfer" in finding.recommendation
    json.dumps(dataclasses.asdict(finding))  # a summary stores it as JSON


def test_moderately_input_bound_is_medium_and_not_input_bound_is_silent():
    assert fire(case_study(wait_pct=10.0)).severity == "medium"
    assert fire(case_study(wait_pct=4.9)) is None
    assert batched_transforms(case_study(), NOT_BOUND) is None
    assert batched_transforms(case_study(), None) is None


@pytest.mark.parametrize("factor, fires", [(0.99, True), (1.0, False), (1.5, False)])
def test_probe_gain_at_the_line_with_free_cores(factor, fires):
    # cores free (50%): only the probe can make the rule speak
    rate = 20.0 * PROBE_GAIN_MIN * factor
    summary = case_study(cpu={"process_cpu_pct": 100.0}, probes=probe({0: 20.0, 1: 15.0, 2: rate}))
    assert (fire(summary) is not None) is fires


@pytest.mark.parametrize("share, fires", [(CORES_BUSY_SHARE - 0.01, False), (CORES_BUSY_SHARE, True)])
def test_cores_busy_at_the_line_when_the_probe_shows_a_gain(share, fires):
    # 4 cores: process plus workers at exactly the line fires, just under it does not
    used_pct = share * 4 * 100.0
    summary = case_study(
        cpu_count=4,
        num_workers=2,
        cpu={"process_cpu_pct": used_pct - 150.0, "workers_cpu_pct": 150.0},
        probes=probe({2: 10.0, 4: 30.0}, suggested=4),
    )
    finding = fire(summary)
    assert (finding is not None) is fires
    if fires:
        assert f"{share * 4:.1f} of 4 usable cores" in finding.evidence


def test_silent_without_evidence_that_workers_cannot_help():
    assert fire(case_study(probes=Probes(), cpu=None)) is None  # nothing measured
    assert fire(case_study(probes=Probes(), cpu={"process_cpu_pct": 100.0})) is None  # one core free of two
    assert (
        fire(case_study(probes=Probes(), cpu_count=None, cpu={"process_cpu_pct": 190.0})) is None
    )  # cores unknown


def test_probe_suggesting_the_current_setting_is_no_gain_whatever_the_rates():
    # the probe stops at the first value that keeps up with the model: its suggestion is its verdict
    summary = case_study(cpu=None, probes=probe({0: 27.0, 1: 50.0}, suggested=0))
    assert "found nothing faster than 0" in fire(summary).evidence
    assert fire(case_study(cpu=None, probes=probe({0: 27.0, 1: 50.0}, suggested=1))) is None


def test_probe_without_a_rate_at_the_current_setting_falls_back_to_its_suggestion():
    # the probe's own verdict: nothing faster than the current 2 workers
    summary = case_study(num_workers=2, cpu=None, probes=probe({4: 30.0}, suggested=2))
    finding = fire(summary)
    assert finding is not None and "found nothing faster than 2" in finding.evidence
    assert fire(case_study(num_workers=2, cpu=None, probes=probe({4: 30.0}, suggested=4))) is None


def test_failed_or_malformed_candidates_are_ignored():
    bad = Probes(
        num_workers=NumWorkersProbe(
            candidates=[{"num_workers": 0, "batches_per_sec": None}, "x", {"num_workers": True}]  # type: ignore[list-item]
        )
    )
    assert fire(case_study(probes=bad, cpu=None)) is None


def test_per_sample_cost_from_the_wait_when_no_probe_ran():
    summary = case_study(probes=Probes())
    assert per_sample_ms(summary) == (37.0 / 64, "median wait 37.0 ms per batch of 64, no workers")
    assert "0.6 ms of data work per sample" in fire(summary).evidence
    # with workers the wait is not the load time of a batch, and without a batch size there is no per-sample
    assert per_sample_ms(case_study(probes=Probes(), num_workers=2)) is None
    assert per_sample_ms(case_study(batch_size=None)) is None


def test_survives_a_json_round_trip_of_the_summary():
    summary = RunSummary.from_dict(json.loads(json.dumps(case_study().to_dict())))
    assert fire(summary).settings_change == {"batched_transforms": True}


def test_input_bound_does_not_ask_for_more_workers_when_workers_cannot_fix_it():
    """One voice: the batched-transforms finding and the input-bound finding never contradict each other."""
    summary = case_study(
        num_workers=1,
        cpu={"process_cpu_pct": 110.0, "workers_cpu_pct": 95.0, "workers_wall_s": 10.0, "workers_cpu_s": 9.5},
        probes=probe({1: 28.0, 2: 29.0}),
    )
    findings = {f.id: f for f in diagnose(summary)}
    assert "batched_transforms" in findings
    assert "num_workers" not in findings["input_bound"].settings_change
    assert "More workers will not help" in findings["input_bound"].recommendation


def test_zero_workers_get_a_first_worker_beside_the_recipe():
    """With 0 workers loading never overlaps the step: a first worker is advised even when the CPU is full."""
    findings = {f.id: f for f in diagnose(case_study())}
    assert "batched_transforms" in findings
    assert findings["input_bound"].settings_change == {"num_workers": 1}


def test_a_probe_with_predicted_steps_is_read_with_overlap_not_by_delivery_rate():
    """0 workers pay every load inside the step: one worker at the same delivery rate still hides the load, so
    the probe showed a gain and only the cores being full speak for the recipe."""
    candidates = [
        {"num_workers": 0, "batches_per_sec": 27.8, "predicted_step_ms": 157.7, "status": "measured"},
        {"num_workers": 1, "batches_per_sec": 26.6, "predicted_step_ms": 120.0, "status": "measured"},
    ]
    summary = case_study(
        probes=Probes(num_workers=NumWorkersProbe(candidates=candidates, suggested=1, reason="r"))
    )
    finding = fire(summary)
    assert "probe" not in finding.evidence.split("; ", 2)[-1]  # no "nothing faster" from the rates
    assert "1.7 of 2 usable cores" in finding.evidence
    candidates[1]["predicted_step_ms"] = 150.0  # under the 1.2x line: the probe found no gain after all
    assert "predicts at most 1.05x the step of num_workers=0" in fire(summary).evidence


def test_one_voice_keeps_fewer_workers_beside_batched_transforms():
    """Workers saturated by the hand-off of large batches (12.6 MB, in memory: 2 workers 9.3-11.7 ms a step, 0
    workers 2.1-2.6 ms here) fire batched_transforms too; the input-bound finding's "Set num_workers=0" was then
    replaced by "More workers will not help". Only more workers are taken back."""
    from lightning_perf.analysis.diagnosis import _one_voice
    from lightning_perf.analysis.summary import Finding, Settings

    summary = RunSummary(settings=Settings(num_workers=2))
    batched = Finding(id="batched_transforms", severity="high", title="t", evidence="e", recommendation="r")

    def input_bound(workers: int) -> Finding:
        return Finding(
            id="input_bound",
            severity="high",
            title="t",
            evidence="e",
            recommendation=f"Set `num_workers={workers}`",
            settings_change={"num_workers": workers},
        )

    fewer = {f.id: f for f in _one_voice([batched, input_bound(0)], summary)}["input_bound"]
    assert fewer.settings_change == {"num_workers": 0} and fewer.recommendation == "Set `num_workers=0`"
    more = {f.id: f for f in _one_voice([batched, input_bound(4)], summary)}["input_bound"]
    assert more.settings_change == {} and "More workers will not help" in more.recommendation
