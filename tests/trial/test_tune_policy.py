"""`tune`'s pure parts: findings -> candidates, the decision, the budget plan, the tuned config file."""

from __future__ import annotations

import pytest
import yaml

from lightning_perf.analysis.summary import Distribution, Finding, RunSummary, Settings
from lightning_perf.trial.decision import KEEP, Speed, choose, speeds_from_trial
from lightning_perf.trial.proposals import COMBINED, SEMANTIC_LABEL, propose
from lightning_perf.trial.spec import TrialResult, VariantResult
from lightning_perf.trial.tuned_config import apply_changes, tuned_path, write_tuned
from lightning_perf.tune.run import plan_rounds

TARGETS = {
    "loader_keys": {
        "num_workers": "data.init_args.num_workers",
        "persistent_workers": "data.init_args.persistent_workers",
        "batch_size": "data.init_args.batch_size",
    },
    "compile": None,
}


def finding(id_: str, change: dict, severity: str = "high") -> Finding:
    return Finding(id_, severity, f"title of {id_}", "evidence", f"do {id_}", change)


def test_the_keys_of_one_settings_change_are_one_candidate():
    """The workers advice carries the persistent workers its text asks for: one candidate, not one a key plus
    their combination (which doubled every tune's rounds); a key a finding cannot apply is listed alone."""
    findings = [
        finding("input_bound", {"num_workers": 4, "persistent_workers": True, "pin_memory": True}),
        finding("persistent_workers", {"persistent_workers": True}, "medium"),  # taken by the first
    ]
    proposal = propose(findings, Settings(), TARGETS)
    (candidate,) = proposal.candidates
    assert candidate.name == "num_workers_4" and candidate.label == "num_workers=4 + persistent_workers"
    assert candidate.changes == {"data.init_args.num_workers": 4, "data.init_args.persistent_workers": True}
    assert [(u.finding, u.change) for u in proposal.unapplied] == [("input_bound", {"pin_memory": True})]


def test_findings_become_config_candidates_their_combination_and_a_list_of_what_is_not_tried():
    findings = [
        finding("input_bound", {"num_workers": 2}),
        finding("workers_exceed_cores", {"num_workers": 8}),  # the more severe finding's value wins
        finding("persistent_workers", {"persistent_workers": True}, "medium"),
        finding("cudnn_benchmark", {"benchmark": True}, "low"),
        finding("pin_memory", {"pin_memory": True}),  # the datamodule takes no pin_memory argument
        finding("batched_transforms", {"batched_transforms": True}),
        finding("host_sync", {}, "medium"),  # advice only: needs code
        finding("validation_share", {"check_val_every_n_epoch": 2}, "medium"),
        finding("low_gpu_util", {"batch_size": 64}, "medium"),  # semantic: not without the flag
        finding("noisy_machine", {}, "low"),  # nothing to do: not listed
    ]
    proposal = propose(findings, Settings(precision="32-true"), TARGETS)
    labels = [c.label for c in proposal.candidates]
    assert labels == [
        "num_workers=2",
        "persistent_workers",
        "benchmark",
        "num_workers=2 + persistent_workers + benchmark",
    ]
    by_name = {c.name: c for c in proposal.candidates}
    assert by_name["num_workers_2"].overrides == [("data.init_args.num_workers", "2")]
    assert by_name["benchmark"].changes == {"trainer.benchmark": True}
    assert by_name[COMBINED].changes == {
        "data.init_args.num_workers": 2,
        "data.init_args.persistent_workers": True,
        "trainer.benchmark": True,
    }
    reasons = {u.finding: u.reason for u in proposal.unapplied}
    assert reasons["batched_transforms"] == "needs code" and reasons["host_sync"] == "needs code"
    assert reasons["pin_memory"].startswith("not in the config")
    assert reasons["validation_share"].startswith("not measured")
    assert "--allow-semantic-changes" in reasons["low_gpu_util"]
    assert "noisy_machine" not in reasons


def test_a_recipe_the_project_switches_on_by_an_argument_is_a_candidate():
    """The project has the batched-transforms code behind a `batched_transforms` argument: tune tries it."""
    targets = {
        **TARGETS,
        "recipes": {"batched_transforms": ["model.init_args.batched_transforms", "data.batched_transforms"]},
    }
    findings = [
        finding("input_bound", {"num_workers": 1}),
        finding("batched_transforms", {"batched_transforms": True}),
    ]
    proposal = propose(findings, Settings(), targets)
    recipe = next(c for c in proposal.candidates if c.name == "batched_transforms")
    assert recipe.overrides == [
        ("model.init_args.batched_transforms", "true"),
        ("data.batched_transforms", "true"),
    ]
    assert not recipe.semantic and proposal.unapplied == []


def test_a_machine_held_by_others_is_listed_as_not_a_config_change():
    proposal = propose([finding("noisy_machine", {}, "high")], Settings(), TARGETS)
    assert [(u.finding, u.reason) for u in proposal.unapplied] == [
        ("noisy_machine", "the machine, not the config")
    ]


def test_semantic_changes_are_candidates_only_when_allowed_and_always_labelled():
    findings = [finding("low_gpu_util", {"batch_size": 64}), finding("bf16", {"precision": "bf16-mixed"})]
    assert propose(findings, Settings(precision="32-true"), TARGETS).candidates == []
    allowed = propose(findings, Settings(precision="32-true"), TARGETS, allow_semantic=True).candidates
    assert [c.semantic for c in allowed] == [True, True, True]
    assert all(SEMANTIC_LABEL in c.label for c in allowed)
    # a run already in mixed precision: another mixed precision is no semantic change
    mixed = propose([finding("bf16", {"precision": "bf16-mixed"})], Settings(precision="16-mixed"), TARGETS)
    assert [(c.label, c.semantic) for c in mixed.candidates] == [("precision=bf16-mixed", False)]


def test_a_model_exposing_compile_gets_a_compile_candidate():
    targets = {**TARGETS, "compile": "model.init_args.compile", "compile_on": False}
    candidates = propose([], Settings(), targets).candidates
    assert [(c.name, c.overrides) for c in candidates] == [("compile", [("model.init_args.compile", "true")])]
    assert propose([], Settings(), {**targets, "compile_on": True}).candidates == []


def test_choose_takes_the_fastest_significant_candidate_else_keeps_the_config():
    speeds = [
        Speed("a", "num_workers=2", 1.62, 1.51, 1.74),
        Speed("b", "combined", 1.90, 0.80, 4.0),  # faster on average but not significant
        Speed("c", "benchmark", 1.20, 1.05, 1.30),
        Speed("d", "boom", error="RuntimeError: injected failure"),
    ]
    decision = choose(speeds)
    assert decision.winner == "a" and decision.judged
    assert decision.line == "num_workers=2: 1.62x faster (95% interval 1.51-1.74x)"
    keep = choose(speeds[1:2] + speeds[3:])
    assert keep.winner is None and keep.judged and keep.line.startswith(KEEP)
    assert "no measurable difference (estimate 1.90x faster, 95% interval 0.80-4.00x)" in keep.line
    slower = choose([Speed("s", "precision", 0.5, 0.4, 0.6)])
    # a slowdown reads as a slowdown, its interval too (1/0.6-1/0.4)
    assert slower.winner is None and "2.00x slower (95% interval 1.67-2.50x)" in slower.line
    failed = choose(speeds[3:])
    assert failed.winner is None and not failed.judged and "every candidate failed" in failed.line


def test_no_significant_candidate_on_disturbed_rounds_is_not_measured_rather_than_keep():
    """A 2x estimate whose interval reaches below 1 because other work disturbed the rounds (CI beside two CPU
    hogs: 2.04x, 0.70-5.94x) is no reason to keep the config: the machine was busy, and tune says so."""
    speeds = [Speed("w4", "num_workers=4", 2.04, 0.70, 5.94)]
    disturbed = [
        "round 2 of baseline was disturbed: other processes used 1.9 of 2 cores (95%)",
        "round 3 of w4 was disturbed: other processes used 1.8 of 2 cores (90%)",
    ]
    busy = choose(speeds, disturbed)
    assert busy.winner is None and not busy.judged  # no verdict: tune exits 1
    assert busy.line.startswith(f"not measured: the machine was busy ({disturbed[0]} and 1 more); ")
    assert "(best: num_workers=4: no measurable difference (estimate 2.04x faster" in busy.line
    assert busy.line.endswith(f"{KEEP} and tune again on a quiet machine")
    # a significant winner stands on disturbed rounds (the disturbance only widens an interval), and quiet
    # rounds keep the config
    assert choose([Speed("w4", "num_workers=4", 3.0, 2.0, 4.5)], disturbed).winner == "w4"
    assert choose(speeds).line.startswith(f"{KEEP}: no candidate is significantly faster")


def test_the_budget_plan_cuts_rounds_then_candidates_and_says_when_nothing_fits():
    assert plan_rounds(10.0, 4, 3, None) == (3, 4)
    assert plan_rounds(10.0, 4, 3, 1000.0) == (3, 4)
    assert plan_rounds(10.0, 4, 3, 85.0) == (2, 4)  # 2 rounds of 4 runs fit, 3 do not
    assert plan_rounds(10.0, 4, 3, 65.0) == (2, 3)  # the last candidate left out
    assert plan_rounds(10.0, 4, 3, 39.0) == (0, 0)  # not even baseline + one candidate twice


def test_the_tuned_config_is_written_beside_the_original_which_stays_byte_identical(tmp_path):
    original = tmp_path / "cfg.yaml"
    text = "# my settings\nmodel:\n  class_path: m.M\ndata:\n  class_path: d.D\ntrainer: {max_epochs: 3}\n"
    original.write_text(text)
    path, diff = write_tuned(str(original), {"data.init_args.num_workers": 2, "trainer.benchmark": True})
    assert path == str(tmp_path / "cfg.tuned.yaml") == tuned_path(str(original))
    assert original.read_text() == text
    tuned = yaml.safe_load((tmp_path / "cfg.tuned.yaml").read_text())
    assert tuned == {
        "model": {"class_path": "m.M"},
        "data": {"class_path": "d.D", "init_args": {"num_workers": 2}},
        "trainer": {"max_epochs": 3, "benchmark": True},
    }
    assert "+  init_args:" in diff and "+    num_workers: 2" in diff and "+  benchmark: true" in diff
    assert apply_changes({"data": "d.D"}, {"data.init_args.n": 1}) == {
        "data": {"class_path": "d.D", "init_args": {"n": 1}}
    }


@pytest.mark.parametrize("bad", [[], {}])
def test_apply_changes_never_touches_its_input(bad):
    config = {"trainer": {"max_epochs": 1}, "extra": bad}
    apply_changes(config, {"trainer.max_epochs": 5})
    assert config == {"trainer": {"max_epochs": 1}, "extra": bad}


def rounds_of(*means: float) -> list[RunSummary]:
    summaries = []
    for mean in means:
        summary = RunSummary()
        summary.timing.step_time_ms = Distribution.of([mean * 0.9, mean, mean * 1.1])
        summaries.append(summary)
    return summaries


def test_the_adapter_pairs_each_candidates_mean_step_time_with_the_baselines_of_the_same_round():
    variants = [
        VariantResult("baseline", "b", status="ok", rounds=rounds_of(100.0, 120.0, 110.0)),
        VariantResult("fast", "f", status="ok", rounds=rounds_of(50.0, 60.0, 55.0)),  # half, round by round
        VariantResult("boom", "x", status="failed", error="RuntimeError: injected failure"),
    ]
    result = TrialResult("t", "dir", 10, variants, repeats=3)
    speeds = {
        s.name: s for s in speeds_from_trial(result, {"fast": "num_workers=2", "boom": "boom"}, "baseline")
    }
    fast = speeds["fast"]
    assert fast.speedup == pytest.approx(2.0) and fast.low == pytest.approx(2.0) and fast.rounds == 3
    assert fast.significant and speeds["boom"].error == "RuntimeError: injected failure"
    assert choose(list(speeds.values())).winner == "fast"


def test_targets_find_a_recipe_switch_on_the_model_and_the_datamodule():
    """A config's targets: tune's names at run time, plus the keys only the config holds, from the facts its
    diagnosis round read of the CLI's classes (cli_facts)."""
    from lightning_perf.trial.project.command import RUNTIME_TARGETS, cli_targets
    from lightning_perf.trial.project.facts import cli_facts

    class Model:
        def __init__(self, batched_transforms: bool = False, compile: bool = False) -> None: ...

    class Data:
        def __init__(
            self, num_workers: int = 0, batch_size: int = 4, batched_transforms: bool = False
        ) -> None: ...

    class Plain:
        def __init__(self, num_workers: int = 0) -> None: ...

    found = cli_targets(cli_facts(({}, Model(), Data())))
    assert found["recipes"] == {"batched_transforms": ["model.batched_transforms", "data.batched_transforms"]}
    assert found["loader_keys"]["batch_size"] == "data.batch_size"
    assert found["loader_keys"]["num_workers"] == "num_workers"  # applied at run time, written by its feeder
    assert found["compile"] == "model.compile" and "compile" not in found["compute_keys"]
    plain = cli_targets(cli_facts(({}, Plain(), Plain())))
    assert plain["recipes"] == {} and plain["loader_keys"] == RUNTIME_TARGETS["loader_keys"]
    assert "compile" in RUNTIME_TARGETS["compute_keys"]  # not changed by a config's targets
