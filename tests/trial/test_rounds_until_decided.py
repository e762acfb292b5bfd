"""Verdicts that hold on the machines people have (issue 48): rounds run until the best candidate's interval
decides (above 1, all below, or within 5% of no change), up to twice the rounds planned and the budget; an
interval too wide to read says how many rounds would tell instead."""

from __future__ import annotations

import time

import pytest

from lightning_perf.trial import rounds
from lightning_perf.trial.decision import Speed, choose, rounds_to_decide, speeds_of, undecided
from lightning_perf.trial.rounds import _run_rounds
from lightning_perf.trial.runner import RoundLimits, RoundReport
from lightning_perf.trial.spec import TrialResult, VariantResult
from tests.trial.test_round_limits_wired import timed

LABELS = {"b": "num_workers=4"}


def speed(speedup, low, high, rounds=3):
    return Speed("b", "num_workers=4", speedup, low, high, rounds=rounds)


def test_what_decides_a_verdict():
    assert undecided([speed(1.6, 1.2, 2.1)]) is None  # faster, decided
    assert undecided([speed(0.7, 0.6, 0.8)]) is None  # slower, decided: keep
    assert undecided([speed(1.01, 0.97, 1.04)]) is None  # within 5% of no change either way
    assert undecided([speed(4.02, 0.87, 18.52)]) == "num_workers=4: interval 0.87-18.52x still spans 1"
    assert undecided([Speed("b", "num_workers=4", rounds=1)]) == "no interval yet"
    assert undecided([Speed("b", "num_workers=4", error="boom")]) is None  # nothing more to learn
    decision = choose([speed(1.01, 0.97, 1.04)])
    assert decision.winner is None and "no difference within 5% either way" in decision.line


def test_an_interval_too_wide_to_read_says_how_many_rounds_would_tell():
    wide = speed(1.3, 0.0001, 12723.12, rounds=2)
    text = wide.describe()
    assert "0.00-12723.12x" not in text and "too few rounds to tell (2)" in text
    assert "--repeats" in text
    # the estimate narrows as t(n-1)/sqrt(n): an interval of 0.87-18.5x around 4x at 3 rounds needs a few more
    need = rounds_to_decide(speed(4.02, 0.87, 18.52, rounds=3))
    assert need is not None and 3 < need <= 10


def fake_rounds(means: dict[str, list[float]]):
    """``_load_round`` giving variant ``name`` its next mean from ``means``, and a quiet ``run_one``."""
    taken: dict[str, int] = {}

    def load(result, run_dir, warmup):
        name = result.name
        index = taken.get(name, 0)
        taken[name] = index + 1
        result.rounds.append(timed(means[name][index]))

    def run_one(outcome, version, run_dir, reporter):
        outcome.round_reports.append(RoundReport())
        return None

    return load, run_one


def trial_with(tmp_path, monkeypatch, means, repeats=3, max_rounds=6, budget_s=3600.0):
    load, run_one = fake_rounds(means)
    monkeypatch.setattr(rounds, "_load_round", load)
    limits = RoundLimits(
        expected_s=1.0,
        budget_deadline=time.monotonic() + budget_s,
        budget_label="--budget-s 9",
        undecided=lambda running: undecided(speeds_of(running, LABELS, "a")),
        max_rounds=max_rounds,
    )
    result = TrialResult("t", str(tmp_path), 5, [], repeats=repeats)
    outcomes = [VariantResult(n, str(tmp_path / n)) for n in ("a", "b")]
    _run_rounds(result, outcomes, run_one, progress=False, limits=limits)
    return result, outcomes


def test_rounds_run_on_until_the_interval_excludes_1(tmp_path, monkeypatch):
    # b is 2x faster, but its third round was slow: after 3 rounds the interval spans 1, a 4th decides it
    means = {"a": [10.0] * 6, "b": [5.0, 5.5, 12.0, 5.0, 5.2, 5.1]}
    result, (a, b) = trial_with(tmp_path, monkeypatch, means)
    assert result.repeats > 3 and len(a.rounds) == len(b.rounds) == result.repeats
    assert a.ok and b.ok
    (speed_b,) = speeds_of(result.variants, LABELS, "a", finished=True)
    assert speed_b.significant and speed_b.rounds == result.repeats
    assert any("beyond the 3 planned, until the verdict was decided" in note for note in result.notes)


def test_a_decided_verdict_runs_no_more_rounds(tmp_path, monkeypatch):
    means = {"a": [10.0] * 6, "b": [5.0, 5.1, 4.9, 5.0, 5.0, 5.0]}
    result, _ = trial_with(tmp_path, monkeypatch, means)
    assert result.repeats == 3 and result.notes == []


def test_an_undecided_verdict_stops_at_the_cap_and_at_the_budget(tmp_path, monkeypatch):
    noisy = {"a": [10.0] * 6, "b": [5.0, 20.0, 5.0, 20.0, 5.0, 20.0]}
    result, _ = trial_with(tmp_path, monkeypatch, noisy)
    assert result.repeats == 6
    assert any("3 round(s) beyond the 3 planned" in n and "still undecided" in n for n in result.notes)
    # a budget with no time for another round: no more rounds, and the note says why
    result, _ = trial_with(tmp_path, monkeypatch, noisy, budget_s=1.5)
    assert result.repeats == 3
    (note,) = result.notes
    assert note.startswith("undecided after 3 rounds") and "no time is left for another" in note


def test_without_an_undecided_question_the_rounds_are_the_planned_ones(tmp_path, monkeypatch):
    load, run_one = fake_rounds({"a": [10.0] * 3, "b": [5.0, 20.0, 5.0]})
    monkeypatch.setattr(rounds, "_load_round", load)
    limits = RoundLimits(expected_s=1.0, budget_deadline=time.monotonic() + 60)
    result = TrialResult("t", str(tmp_path), 5, [], repeats=3)
    outcomes = [VariantResult(n, str(tmp_path / n)) for n in ("a", "b")]
    _run_rounds(result, outcomes, run_one, progress=False, limits=limits)
    assert result.repeats == 3 and result.notes == []


@pytest.mark.parametrize("rounds_seen", [2, 5])
def test_the_rounds_estimate_never_asks_for_fewer_than_were_run(rounds_seen):
    need = rounds_to_decide(speed(1.2, 0.5, 2.9, rounds=rounds_seen))
    assert need is None or need >= rounds_seen
