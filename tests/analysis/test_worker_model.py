"""Each worker count's step with the hand-off charged (rules/worker_model.py), and no two input findings of one run
contradicting each other over every combination of loader, worker count, hand-off and machine (issue 42). The real
fits are in tests/callback/test_worker_handoff.py."""

from __future__ import annotations

import itertools

import pytest

from lightning_perf.analysis.diagnosis import diagnose
from lightning_perf.analysis.probe_results import HandOff, NumWorkersProbe
from lightning_perf.analysis.rules.inputs.loading import suggest_workers
from lightning_perf.analysis.rules.inputs.worker_model import (
    HandOffCost,
    charged_choice,
    handoff_of,
    predicted_step_ms,
)
from lightning_perf.analysis.summary import MachineState, RunSummary
from tests.analysis.test_rules_loading import computing_run, storage_run
from tests.input_consistency import contradictions

QUICK = {"ms_per_batch": 2.5, "main_ms": 0.9, "touch_ms": 0.0, "load_ms": 0.1, "batch_bytes": 528}


def with_handoff(summary: RunSummary, **figures) -> RunSummary:
    summary.probes.handoff = HandOff(**{**QUICK, **figures})
    return summary


def test_the_step_model_charges_the_hand_off():
    cost = HandOffCost(per_batch_ms=2.5, main_ms=0.9, batch_bytes=528)
    assert predicted_step_ms(0, load_ms=0.1, compute_ms=0.6, handoff=cost) == pytest.approx(0.7)
    # one worker: 1.2 x (0.1 + 2.5) per batch, of which the step hides 0.6
    assert predicted_step_ms(1, 0.1, 0.6, cost) == pytest.approx(0.6 + 1.2 * 2.6 - 0.6)
    # many workers: the training thread's own share of each hand-off is the floor
    assert predicted_step_ms(64, 0.1, 0.6, cost) == pytest.approx(0.6 + 0.9)


def test_a_hand_off_figure_read_back_from_json_or_absent():
    assert handoff_of(RunSummary()) is None
    summary = with_handoff(RunSummary(), ms_per_batch=None)
    assert handoff_of(summary) is None  # not measured (its error says why)
    cost = handoff_of(with_handoff(RunSummary(), touch_ms="x"))
    assert cost is not None and cost.touch_ms == 0.0 and cost.load_ms == pytest.approx(0.1)


def test_a_quick_fetch_with_0_workers_keeps_0():
    """0.72 ms steps, 0.1 ms of them the fetch: before, 'num_workers=1' (4.4x slower)."""
    summary = with_handoff(storage_run(0, wait_pct=14.0, step_ms=0.72, wait_ms=0.1))
    advice = suggest_workers(summary)
    workers, why = advice.count, advice.why
    assert workers is None and "hands a batch over in 2.50 ms for 528 bytes" in why
    assert by_id(summary, "input_bound").settings_change == {}


def test_a_quick_fetch_whose_hand_off_was_not_measured_keeps_0():
    """CI beside heavy load: the hand-off's probe timed out (worker start-up past its budget) and a 0.2 ms fetch
    that read as waiting (the training thread blocked, not on a core) was told 'num_workers=2' by the estimate."""
    summary = with_handoff(storage_run(0, wait_pct=17.0, step_ms=1.1, wait_ms=0.2), ms_per_batch=None)
    advice = suggest_workers(summary)
    workers, why = advice.count, advice.why
    assert (
        workers is None and not advice.measured and why.startswith("not measured") and "keep 0 workers" in why
    ), why
    assert by_id(summary, "input_bound").settings_change == {}
    # a fetch dearer than any hand-off is still sized by the estimate
    assert suggest_workers(storage_run(0)).count >= 2


def test_a_probe_that_timed_only_0_workers_leaves_it_to_the_hand_off():
    """CI: a probe whose budget a busy machine spent on 0 workers alone ('suggested 0', nothing beside it) advised
    'num_workers=1' from the rule that 0 workers never overlap; the measured hand-off says 0 stays fastest."""
    summary = with_handoff(storage_run(0, wait_pct=14.0, step_ms=0.72, wait_ms=0.1))
    summary.probes.num_workers = NumWorkersProbe(
        suggested=0,
        reason="0 workers: the only count timed within the budget",
        candidates=[
            {"num_workers": 0, "batches_per_sec": 9000.0},
            {"num_workers": 1, "error": "budget spent"},
        ],
    )
    advice = suggest_workers(summary)
    workers, why = advice.count, advice.why
    assert workers is None and "the num_workers probe timed no worker count beside 0" in why
    # without a hand-off figure, the rule stands: 0 workers never overlap the step
    summary.probes.handoff = None
    assert suggest_workers(summary).count == 1


def test_workers_idle_on_the_hand_off_are_told_0():
    """2 workers handing over cheap batches (load 0.1 ms timed after the fit): fewer workers, down to 0."""
    summary = with_handoff(storage_run(2, wait_pct=45.0, step_ms=3.5, wait_ms=1.6))
    advice = suggest_workers(summary)
    workers, why = advice.count, advice.why
    assert workers == 0 and why.startswith("the hand-off costs more than the loading")
    assert "predicted step 2.00 ms with 0 workers against 3.50 ms measured with 2 workers" in why
    found = {f.id for f in diagnose(summary)}
    assert "prefetch_factor" not in found and "persistent_workers" not in found


def test_a_slow_storage_loader_still_gets_workers_past_the_cores():
    summary = with_handoff(storage_run(0), load_ms=None)
    advice = suggest_workers(summary)
    workers, why = advice.count, advice.why
    assert workers is not None and workers >= 8 and "the loading costs more than its hand-off" in why
    change = by_id(summary, "input_bound").settings_change
    assert change == {"num_workers": workers, "persistent_workers": True}  # the text says both


def test_a_run_with_workers_is_told_at_most_twice_as_many():
    summary = with_handoff(storage_run(4), load_ms=None)
    workers = suggest_workers(summary).count
    assert workers == 8


def test_the_run_s_own_count_near_the_best_is_kept():
    # 10 ms of loading hidden by 20 ms of compute with 1 worker: nothing is 5% faster
    summary = with_handoff(storage_run(1, wait_pct=4.0, step_ms=21.0, wait_ms=0.9), load_ms=10.0)
    assert charged_choice(summary, cap=8)[0] is None


def by_id(summary: RunSummary, finding: str):
    return next(f for f in diagnose(summary) if f.id == finding)


RUNS = {"storage": storage_run, "computing": computing_run}
HANDOFFS = {
    "none": None,
    "quick": {},
    "costly": {"ms_per_batch": 300.0, "main_ms": 50.0, "load_ms": None},
}
MACHINES = {
    "quiet": None,
    "held": MachineState(
        wall_s=30.0, cpu_count=2, own_cores=0.3, other_cores=1.9, train_thread_runqueue_pct=40.0
    ),
}


@pytest.mark.parametrize(
    "run, workers, handoff, machine", list(itertools.product(RUNS, (0, 1, 2, 4), HANDOFFS, MACHINES))
)
def test_no_two_input_findings_contradict(run, workers, handoff, machine):
    summary = RUNS[run](workers)
    if HANDOFFS[handoff] is not None:
        with_handoff(summary, **HANDOFFS[handoff])
    summary.machine = MACHINES[machine]
    summary.findings = diagnose(summary)
    assert not contradictions(summary), contradictions(summary)


def test_a_quick_fetch_that_waited_for_busy_cores_is_charged_its_own_load():
    """Beside two CPU hogs a 0.035 ms in-memory fetch read 0.82 ms on the mean (25.9 ms at most: the thread
    descheduled mid-fetch), 'waiting' 88% of its time, and the model then found 2 workers faster. The fetch timed
    after the fit (``load_ms``) is what a batch costs to load; the hand-off costs 4.15 ms."""
    summary = with_handoff(
        storage_run(0, wait_pct=22.0, step_ms=3.73, wait_ms=0.82, cpu_count=2),
        ms_per_batch=4.15,
        main_ms=0.52,
        load_ms=0.035,
    )
    summary.machine = MachineState(cpu_count=2, other_cores=1.78, train_thread_runqueue_pct=75.8)
    # its sampled fetches: 3.9% on a core, 8.4% waiting for one, the rest blocked
    summary.timing.fetch_runqueue_ms, summary.timing.fetch_runqueue_wall_ms = 67.2, 800.0
    summary.timing.fetches_runqueue_sampled = 10
    advice = suggest_workers(summary)
    workers, why = advice.count, advice.why
    assert workers is None, why
    assert "fetched in the training process after the fit" in why
    quiet = with_handoff(
        storage_run(0, wait_pct=22.0, step_ms=3.73, wait_ms=0.82), ms_per_batch=4.15, load_ms=0.035
    )
    assert "the run's fetches in the training thread" in suggest_workers(quiet).why
