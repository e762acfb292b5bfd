"""trial and tune use the runner's round limits: tune's budget stops the rounds at it (the rounds run in full
kept, a note saying so), a hung round ends at the limit derived from the expected round time, a disturbed round
is named in the report and its JSON, and SIGTERM/SIGHUP end the command saying the runs done are kept."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import psutil
import pytest
import yaml

from lightning_perf.analysis.summary import Distribution, MachineState, RunSummary, TimingSummary
from lightning_perf.cli import main
from lightning_perf.trial import rounds, runner
from lightning_perf.trial.api import run_command_trial
from lightning_perf.trial.decision import Decision
from lightning_perf.trial.project.command import config_command
from lightning_perf.trial.proposals import Proposal
from lightning_perf.trial.rounds import _run_rounds
from lightning_perf.trial.runner import RoundLimits, RoundReport, Terminated
from lightning_perf.trial.spec import TrialResult, VariantResult
from lightning_perf.tune import run as tune
from lightning_perf.tune.config_project import ConfigProject
from lightning_perf.tune.run import TuneResult, run_tune
from tests.helpers import TinyModel

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA = {"class_path": "tests.helpers.TinyDataModule", "init_args": {"n": 200, "batch_size": 4}}


class HangWhenMarked(TinyModel):
    """TinyModel whose first training step sleeps an hour once the file ``marker`` exists: a round that hangs
    from a chosen round on."""

    def __init__(self, marker: str = "", step_delay_s: float = 0.0) -> None:
        super().__init__(step_delay_s=step_delay_s)
        self.marker = marker

    def training_step(self, batch, batch_idx):
        if self.seen_batches == 0 and self.marker and os.path.exists(self.marker):
            time.sleep(3600.0)
        return super().training_step(batch, batch_idx)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's project dir; its classes import through PYTHONPATH, as a user's would."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    return tmp_path


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def left_running(earlier: set[int]) -> list[int]:
    alive = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.pid not in earlier and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc.pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def timed(mean_ms: float) -> RunSummary:
    """A round's summary with five timed steps around ``mean_ms``."""
    samples = [mean_ms * f for f in (0.9, 0.95, 1.0, 1.05, 1.1)]
    return RunSummary(
        timing=TimingSummary(steps=5, step_samples_ms=samples, step_time_ms=Distribution.of(samples))
    )


# -- the budget ------------------------------------------------------------------------------------------------


@pytest.mark.once  # rounds of real fits, timed: the same on every Lightning
@pytest.mark.timeout(180)
def test_tune_stops_at_its_budget_mid_rounds_keeps_the_full_rounds_and_says_so(project, monkeypatch):
    marker = project / "hang-from-now-on"
    config = {"model": {"class_path": f"{__name__}.HangWhenMarked"}, "data": DATA}
    (project / "exp.yaml").write_text(yaml.safe_dump(config))
    # the plan trusts the budget to hold three rounds; the candidate hangs from round 2 on (its round first
    # there: the order rotates), so the budget stops that round and starts none after it
    monkeypatch.setattr(tune, "propose", lambda *args, **kwargs: Proposal([], []))
    monkeypatch.setattr(tune, "plan_rounds", lambda run_s, variants, repeats, left: (repeats, variants))
    loaded = []
    real_load = rounds._load_round

    def load_round(result, run_dir, warmup_steps):
        real_load(result, run_dir, warmup_steps)
        loaded.append(run_dir)
        if len(loaded) == 2:  # round 1 of both variants is in
            marker.write_text("")

    monkeypatch.setattr(rounds, "_load_round", load_round)
    earlier = children()
    budget_s = 45.0
    started = time.monotonic()
    result = run_tune(
        "exp.yaml",
        steps=4,
        repeats=3,
        budget_s=budget_s,
        extra=[("hang", [("model.init_args.marker", str(marker))])],
    )
    took = time.monotonic() - started
    text = result.render()
    assert result.diagnosis_error is None, text
    assert took < budget_s + 20, text  # stopped at the budget, not at a derived limit (120 s at least)
    trial = result.trial
    assert trial is not None and marker.exists(), text  # round 1 ran in full before the budget
    assert result.rounds == trial.repeats == 1
    note = "stopped at the budget (--budget-s 45): 1 of 3 rounds ran in full"
    assert note in trial.notes and f"note: {note}" in text
    experiment = project / "perf_logs" / "exp_tune"
    for variant in trial.variants:  # the partial round was dropped, and no round ran past it
        assert variant.status == "ok" and variant.error is None, text
        assert len(variant.rounds) == len(variant.round_dirs) == len(variant.round_reports) == 1
        assert [Path(d).resolve() for d in variant.round_dirs] == [experiment / variant.name / "round_1"]
        assert not (experiment / variant.name / "round_3").exists()
    assert not (experiment / "baseline" / "round_2").exists()  # after the stopped round: never started
    assert (experiment / "hang" / "round_2").exists()  # the round the budget stopped
    # one round gives no interval: no verdict, said so
    assert not result.decision.judged and result.tuned_path is None
    assert "no interval (1 complete round(s); at least 2 are needed)" in text
    data = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert data["rounds"] == 1 and data["trial"]["repeats"] == 1 and note in data["trial"]["notes"]
    assert not left_running(earlier)


def fake_round(outcomes_stopped: dict[tuple[str, int], str], limits: RoundLimits):
    """A ``run_one`` that fits nothing: round ``(name, n)`` in ``outcomes_stopped`` is stopped by the budget
    ("budget", which it spends) or fails ("fail")."""
    counts: dict[str, int] = {}

    def run_one(outcome, version, run_dir, reporter):
        counts[outcome.name] = counts.get(outcome.name, 0) + 1
        report = RoundReport()
        outcome.round_reports.append(report)
        what = outcomes_stopped.get((outcome.name, counts[outcome.name]))
        if what == "budget":
            limits.budget_deadline = time.monotonic()
            report.stopped = "budget"
            return "stopped at the budget (--budget-s 9) after 9 s; the worker was stopped"
        if what == "fail":
            return "RuntimeError: injected failure"
        return None

    return run_one


def test_a_round_the_budget_stops_is_dropped_not_failed(tmp_path, monkeypatch):
    monkeypatch.setattr(
        rounds, "_load_round", lambda result, run_dir, warmup: result.rounds.append(timed(10.0))
    )
    limits = RoundLimits(budget_deadline=time.monotonic() + 3600, budget_label="--budget-s 9")
    result = TrialResult("t", str(tmp_path), 5, [], repeats=4)
    outcomes = [VariantResult(n, str(tmp_path / n)) for n in ("a", "b", "c")]
    # round 3 (c a b): c fails, then a is stopped by the budget; b's round 3 never starts
    run_one = fake_round({("c", 3): "fail", ("a", 3): "budget"}, limits)
    _run_rounds(result, outcomes, run_one, progress=False, limits=limits)
    a, b, c = outcomes
    assert result.repeats == 2 and result.notes == [
        "stopped at the budget (--budget-s 9): 2 of 4 rounds ran in full"
    ]
    for v in (a, b):
        assert v.ok and len(v.rounds) == len(v.round_dirs) == 2 and v.summary is not None
        assert [Path(d).name for d in v.round_dirs] == ["round_1", "round_2"]
    assert len(a.round_reports) == 2
    assert c.status == "failed" and c.error == "RuntimeError: injected failure"  # a real failure stands

    # spent before any full round: nothing is measured, and the report says why
    limits = RoundLimits(budget_deadline=time.monotonic() + 3600, budget_label="--budget-s 9")
    result = TrialResult("t", str(tmp_path), 5, [], repeats=3)
    outcomes = [VariantResult(n, str(tmp_path / n)) for n in ("a", "b")]
    _run_rounds(result, outcomes, fake_round({("b", 1): "budget"}, limits), progress=False, limits=limits)
    assert result.repeats == 0
    assert result.notes == ["stopped at the budget (--budget-s 9): 0 of 3 rounds ran in full"]
    for v in outcomes:
        assert v.status == "failed" and v.rounds == [] and v.round_dirs == []
        assert v.error == "not measured: the budget (--budget-s 9) was spent before a full round"


def test_the_most_disturbed_round_runs_again_when_the_budget_allows(tmp_path, monkeypatch):
    def load(result, run_dir, warmup):  # a rerun's figures are told apart by their mean
        result.rounds.append(timed(99.0 if run_dir.endswith("_again") else 10.0))

    monkeypatch.setattr(rounds, "_load_round", load)
    started: list[str] = []

    def run_one(outcome, version, run_dir, reporter):
        started.append(version)
        said = "other processes used 1.9 of 2 cores (95%)" if version == "b/round_2" else None
        outcome.round_reports.append(RoundReport(disturbed=said))
        return None

    limits = RoundLimits(expected_s=1.0, budget_deadline=time.monotonic() + 3600, budget_label="--budget-s 9")
    result = TrialResult("t", str(tmp_path), 5, [], repeats=3)
    outcomes = [VariantResult(n, str(tmp_path / n)) for n in ("a", "b")]
    _run_rounds(result, outcomes, run_one, progress=False, limits=limits)
    assert started[-2:] == ["b/round_2_again", "a/round_2_again"]  # the round's own order, every variant
    assert result.notes == [
        "round 2 was disturbed by other work on the machine and was run again (round_2_again)"
    ]
    for v in outcomes:
        assert v.ok and [r.timing.step_time_ms.mean for r in v.rounds] == pytest.approx([10.0, 99.0, 10.0])
        assert Path(v.round_dirs[1]).name == "round_2_again" and len(v.round_reports) == 3
    assert not result.render().count("was disturbed:")  # the rerun was quiet: no disturbed round is left

    # the budget leaves no time for a round of both: named, not run
    limits = RoundLimits(expected_s=600.0, budget_deadline=time.monotonic() + 60, budget_label="--budget-s 9")
    result = TrialResult("t", str(tmp_path), 5, [], repeats=3)
    outcomes = [VariantResult(n, str(tmp_path / n)) for n in ("a", "b")]
    started.clear()
    _run_rounds(result, outcomes, run_one, progress=False, limits=limits)
    assert not [v for v in started if v.endswith("_again")]
    (note,) = result.notes
    assert note.startswith("round 2 was disturbed; not run again:") and "a round takes about 1200 s" in note


# -- a hung round ----------------------------------------------------------------------------------------------


@pytest.mark.once  # rounds of real fits, timed: the same on every Lightning
@pytest.mark.timeout(180)
def test_a_round_that_sleeps_an_hour_ends_at_the_limit_the_first_finished_round_set(project, monkeypatch):
    # small for the test: a round's limit is 1.5x the expected time (the default: 10x, at least 120 s)
    monkeypatch.setattr(runner, "ROUND_TIMEOUT_FACTOR", 1.5)
    monkeypatch.setattr(runner, "ROUND_TIMEOUT_FLOOR_S", 1.0)
    marker = project / "hang"
    marker.write_text("")  # the hung variant sleeps in its first step: it reports no pace of its own
    config = {"model": {"class_path": f"{__name__}.HangWhenMarked"}, "data": DATA}
    (project / "exp.yaml").write_text(yaml.safe_dump(config))
    earlier = children()
    started = time.monotonic()
    result = run_command_trial(
        config_command(["exp.yaml"]),
        [("baseline", []), ("hung", [("model.init_args.marker", str(marker))])],
        steps=6,
        log_dir="perf_logs",
        name="exp",
        repeats=2,
        config_keys=True,
    )
    took = time.monotonic() - started
    baseline, hung = result.variants
    assert baseline.ok and len(baseline.round_reports) == 2, baseline.error
    first = baseline.round_reports[0]
    assert first.stopped is None and first.limit_s is not None and first.wall_s > 0
    # round 1 ran the baseline first (the order rotates after): its time set the hung round's limit
    expected = first.wall_s
    match = re.fullmatch(
        r"timed out after (\d+) s( at step 0/\d+)?; the worker was stopped \(no --timeout-s: 1.5x the expected "
        r"round time of ([\d.]+) s \(the first finished round, baseline/round_1\), at least 1 s\)",
        hung.error or "",
    )
    assert hung.status == "failed" and match, hung.error
    assert float(match.group(3)) == pytest.approx(expected, abs=0.1)
    (report,) = hung.round_reports
    assert report.stopped == "timeout" and report.limit_s == pytest.approx(1.5 * expected)
    assert "the first finished round, baseline/round_1" in report.limit_why
    assert took < 120 and not left_running(earlier)  # not an hour, and nothing left behind
    assert f"hung: {hung.error}" in result.render()


# -- a disturbed round -----------------------------------------------------------------------------------------


def test_a_disturbed_round_is_named_in_the_report_and_its_json(monkeypatch):
    quiet, busy = timed(10.0), timed(10.0)
    busy.machine = MachineState(cpu_count=2, other_cores=1.5)
    said = "other processes used 1.5 of 2 cores (75%)"
    monkeypatch.setattr(runner, "disturbance", lambda summary: said if summary is busy else None)
    base = VariantResult("baseline", "b", status="ok", rounds=[quiet, quiet], summary=quiet)
    base.round_reports = [RoundReport(), RoundReport(disturbed="steal 12%")]  # as the worker said it
    other = VariantResult("other", "o", status="ok", rounds=[quiet, busy], summary=quiet)
    result = TrialResult("t", "dir", 5, [base, other], repeats=2, notes=["an earlier note"])

    lines = result.render().splitlines()
    assert lines[1:4] == [
        "note: an earlier note",
        "note: round 2 of baseline was disturbed: steal 12%",
        f"note: round 2 of other was disturbed: {said}",
    ]
    assert f"> note: round 2 of other was disturbed: {said}" in result.render("markdown")
    data = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    by_name = {v["name"]: v for v in data["variants"]}
    assert by_name["baseline"]["disturbed_rounds"] == [{"round": 2, "line": "steal 12%"}]
    assert by_name["other"]["disturbed_rounds"] == [{"round": 2, "line": said}]
    assert data["notes"] == ["an earlier note"]  # the disturbed rounds are the variants' own

    # tune's report names it among its notes, and its JSON holds the trial's
    tuned = TuneResult("exp.yaml", "dir", trial=result, decision=Decision(None, "keep your config"))
    assert f"note: round 2 of other was disturbed: {said}" in tuned.render()
    assert tuned.to_dict()["trial"]["variants"][1]["disturbed_rounds"] == [{"round": 2, "line": said}]

    monkeypatch.setattr(
        runner, "disturbance", lambda summary: None
    )  # a quiet machine: the worker's word stays
    named = [line for line in result.render().splitlines() if "disturbed" in line]
    assert named == ["note: round 2 of baseline was disturbed: steal 12%"]


# -- SIGTERM and SIGHUP ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_terminated_trial_or_tune_says_the_runs_done_are_kept(project, monkeypatch, capsys, signum):
    (project / "exp.yaml").write_text(yaml.safe_dump({"model": {"class_path": "tests.helpers.TinyModel"}}))

    def terminated(*args, **kwargs):
        raise Terminated(signum)

    monkeypatch.setattr(ConfigProject, "trial", terminated)
    monkeypatch.setattr("lightning_perf.cli.tune.run_tune", terminated)
    code = main(["trial", "--config", "exp.yaml", "--steps", "4", "--variant", "a", "--variant", "b"])
    assert code == 128 + signum
    err = capsys.readouterr().err
    assert "lightning-perf trial: terminated; the runs done are kept" in err
    assert main(["tune", "--config", "exp.yaml"]) == 128 + signum
    err = capsys.readouterr().err
    assert "lightning-perf tune: terminated; the runs done are kept" in err and "no tuned config" in err
