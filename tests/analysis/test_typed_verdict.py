"""Issue 55 (typed states): the input-bound finding carries its grade in a ``verdict`` field that the console and
the Perf tab read, never the title's words; summaries written before the field still show their verdict; the
workers advice says whether it was measured in a flag, not in its text's first words."""

from __future__ import annotations

import dataclasses
import json

import pytest

from lightning_perf.analysis.compute import mfu_rules
from lightning_perf.analysis.compute.mfu_rules import Cause, CauseKind
from lightning_perf.analysis.diagnosis import diagnose, input_bound_verdict
from lightning_perf.analysis.findings_render import render_answer, render_markdown
from lightning_perf.analysis.probe_results import NumWorkersProbe
from lightning_perf.analysis.rules.inputs import waiting
from lightning_perf.analysis.rules.inputs.loading import WorkersAdvice, suggest_workers
from lightning_perf.analysis.rules.thresholds import VERDICTS
from lightning_perf.analysis.summary import RunSummary
from tests.analysis.test_diagnosis import by_id, make
from tests.analysis.test_rules_loading import storage_run
from tests.analysis.test_rules_mfu import with_limit


@pytest.mark.parametrize("pct", [50.0, 10.0, 2.0])
def test_the_input_bound_finding_carries_its_grade_and_keeps_it_through_json(pct, tmp_path):
    summary = make(pct, step_ms=20, wait_ms=pct / 5, num_workers=2, cpu_count=16)
    summary.findings = diagnose(summary)
    found = by_id(summary.findings, "input_bound")
    assert found.verdict == input_bound_verdict(pct) and found.verdict in VERDICTS
    summary.save(tmp_path / "perf_summary.json")
    written = json.loads((tmp_path / "perf_summary.json").read_text())
    (entry,) = [f for f in written["findings"] if f["id"] == "input_bound"]
    assert entry["verdict"] == found.verdict
    assert by_id(RunSummary.load(tmp_path / "perf_summary.json").findings, "input_bound") == found


def test_a_short_run_keeps_its_hedged_grade_and_a_too_short_one_has_none():
    hedged = make(50.0)
    hedged.timing = dataclasses.replace(hedged.timing, steps=12)
    found = by_id(diagnose(hedged), "input_bound")
    assert found.title.startswith("Training may be") and found.verdict == VERDICTS[0]
    too_short = make(50.0)
    too_short.timing = dataclasses.replace(too_short.timing, steps=3)
    found = by_id(diagnose(too_short), "input_bound")
    assert found.verdict is None and waiting.verdict_of(found) == waiting.TOO_SHORT_TITLE


def test_a_reworded_title_does_not_change_the_verdict_shown():
    summary = make(50.0, step_ms=20, wait_ms=10, num_workers=2, cpu_count=16)
    findings = diagnose(summary)
    reworded = [
        dataclasses.replace(f, title="The DataLoader is slow") if f.id == "input_bound" else f
        for f in findings
    ]
    assert waiting.verdict_of(by_id(reworded, "input_bound")) == "highly input-bound"
    assert render_answer(reworded, summary).startswith("lightning-perf: highly input-bound - ")
    assert "**Verdict: highly input-bound.**" in render_markdown(reworded, summary)


def test_a_finding_written_before_the_field_is_read_from_its_title(tmp_path):
    summary = make(10.0, step_ms=20, wait_ms=2, num_workers=2, cpu_count=16)
    summary.findings = diagnose(summary)
    data = summary.to_dict()
    for finding in data["findings"]:
        del finding["verdict"]  # as the previous release wrote it
    (tmp_path / "perf_summary.json").write_text(json.dumps(data))
    old = RunSummary.load(tmp_path / "perf_summary.json")
    found = by_id(old.findings, "input_bound")
    assert found.verdict is None and waiting.verdict_of(found) == "moderately input-bound"
    assert render_answer(old.findings, old).startswith("lightning-perf: moderately input-bound - ")


def test_workers_advice_says_whether_it_was_measured():
    busy = storage_run(0)
    busy.probes.num_workers = NumWorkersProbe(reason="r", disturbed=True, machine_note="others used 2 cores")
    assert suggest_workers(busy) == WorkersAdvice(None, suggest_workers(busy).why, measured=False)
    quiet = storage_run(0)
    quiet.probes.num_workers = NumWorkersProbe(
        candidates=[
            {"num_workers": 0, "batches_per_sec": 10.0},
            {"num_workers": 1, "batches_per_sec": 30.0},
        ],
        suggested=1,
        reason="r",
    )
    assert suggest_workers(quiet).measured and suggest_workers(quiet).count == 1


def test_the_recommendation_follows_the_measured_flag_not_the_words(monkeypatch):
    summary = make(50.0, step_ms=20, wait_ms=10, num_workers=2, cpu_count=16)
    monkeypatch.setattr(
        waiting, "suggest_workers", lambda _: WorkersAdvice(None, "others held the cores", False)
    )
    found = by_id(diagnose(summary), "input_bound")
    assert found.recommendation == "No workers count is advised (others held the cores)."
    assert found.settings_change == {}


def test_the_low_mfu_causes_are_typed_and_the_advice_follows_their_kind():
    # 40 matmuls of 10 kFLOP in a 2 ms step: launch-bound, the cause's kind says so
    summary = with_limit(make(1.0, step_ms=2.0), flops=4e5, calls=40, step_ms=2.0)
    causes = mfu_rules._causes(summary.compute_limit, summary)
    assert [c.kind for c in causes] == [CauseKind.OVERHEAD]
    assert causes[0].text.startswith("launch/framework overhead: the step's 40 counted operators")
    # the advice reads the kind, not the words: the same kinds in other words advise the same
    reworded = [Cause(CauseKind.OVERHEAD, "operators too small for the device")]
    assert mfu_rules._advice(reworded, {}) == mfu_rules._advice(causes, {})
    assert "CUDA graphs" in mfu_rules._advice(reworded, {})
    assert "bf16" not in mfu_rules._advice([Cause(CauseKind.REST_OF_STEP, "precision: words only")], {})
