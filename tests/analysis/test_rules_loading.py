"""Why a batch is late (rules/loading.py) and the advice built on it, on hand-built summaries.

The real fits with loaders of known cost are in tests/callback/test_input_advice.py.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from lightning_perf.analysis.diagnosis import diagnose
from lightning_perf.analysis.probe_results import NumWorkersProbe
from lightning_perf.analysis.rules.inputs.loading import (
    COMPUTES,
    WAITS,
    loading_of,
    machine_busy,
    suggest_workers,
)
from lightning_perf.analysis.rules.noise import HELD_TITLE
from lightning_perf.analysis.summary import MachineState, RunSummary
from tests.analysis.test_diagnosis import by_id, make


def storage_run(num_workers: int, **overrides) -> RunSummary:
    """A loader that sleeps: 91% wait, its CPU time a few percent of its wall time."""
    kwargs: dict = dict(wait_pct=91.0, step_ms=88.0, wait_ms=80.0, num_workers=num_workers, cpu_count=2)
    if num_workers == 0:
        kwargs["timing"] = {"fetch_wall_ms": 800.0, "fetch_cpu_ms": 30.0, "fetches_sampled": 10}
        kwargs["cpu"] = {"process_cpu_pct": 15.0, "workers_cpu_pct": 0.0}
    else:
        kwargs["cpu"] = {
            "process_cpu_pct": 15.0,
            "workers_cpu_pct": 4.0 * num_workers,
            "num_workers_seen": num_workers,
            "workers_wall_s": 20.0 * num_workers,
            "workers_cpu_s": 0.8 * num_workers,
            "workers_runqueue_s": 0.1 * num_workers,
        }
    kwargs.update(overrides)
    return make(**kwargs)


def computing_run(num_workers: int, **overrides) -> RunSummary:
    """Per-sample transforms on the CPU: the loading's CPU time close to its wall time."""
    kwargs: dict = dict(wait_pct=40.0, step_ms=100.0, wait_ms=40.0, num_workers=num_workers, cpu_count=2)
    if num_workers == 0:
        kwargs["timing"] = {"fetch_wall_ms": 400.0, "fetch_cpu_ms": 390.0, "fetches_sampled": 10}
        kwargs["cpu"] = {"process_cpu_pct": 98.0, "workers_cpu_pct": 0.0}
    else:
        kwargs["cpu"] = {
            "process_cpu_pct": 95.0,
            "workers_cpu_pct": 97.0 * num_workers,
            "num_workers_seen": num_workers,
            "workers_wall_s": 20.0 * num_workers,
            "workers_cpu_s": 19.4 * num_workers,
            "workers_runqueue_s": 0.3 * num_workers,
        }
    kwargs.update(overrides)
    return make(**kwargs)


def workers_advised(summary: RunSummary) -> int | None:
    return by_id(diagnose(summary), "input_bound").settings_change.get("num_workers")


# --- the model ------------------------------------------------------------------------------------------


def test_zero_workers_fetch_that_sleeps_waits():
    loading = loading_of(storage_run(0))
    assert loading.cause == WAITS and loading.cpu_share == pytest.approx(30 / 800)
    assert "the training thread's fetches wait 96.2% of their time" in loading.describe()


def test_workers_split_cpu_run_queue_and_waiting():
    loading = loading_of(computing_run(2))
    assert loading.cause == COMPUTES
    assert loading.cpu_share == pytest.approx(0.97) and loading.queue_share == pytest.approx(0.015)
    assert loading.describe().startswith("the 2 DataLoader workers compute 97.0% of their time")


def test_too_few_sampled_fetches_measure_nothing():
    two = {"fetch_wall_ms": 80.0, "fetch_cpu_ms": 3.0, "fetches_sampled": 2}
    assert loading_of(storage_run(0, timing=two)) is None
    assert loading_of(storage_run(0, timing={"fetches_sampled": 0})) is None


def test_workers_waiting_for_a_core_are_not_waiting_on_storage():
    """Busy cores show as run-queue time, so a computing worker on a loaded machine is not called waiting."""
    summary = computing_run(2)
    summary.utilization.cpu.workers_cpu_s, summary.utilization.cpu.workers_runqueue_s = 20.0, 18.0
    assert loading_of(summary).cause == COMPUTES


# --- advice ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("current", [0, 2, 4])
def test_storage_that_waits_gets_more_workers_past_the_cores_never_cpu_bound(current):
    summary = storage_run(current)
    findings = {f.id: f for f in diagnose(summary)}
    advised = findings["input_bound"].settings_change["num_workers"]
    assert advised > current and advised >= 2 and advised > summary.settings.cpu_count
    assert (
        "wait" in findings["input_bound"].evidence
        and "past the core count" in findings["input_bound"].recommendation
    )
    assert "batched_transforms" not in findings and "workers_exceed_cores" not in findings
    assert not any("CPU-bound" in f.title for f in findings.values())


def test_storage_that_waits_is_not_cpu_bound_even_with_a_probe_that_found_no_gain():
    """The first user report: a probe that measured nothing faster must not turn a waiting loader CPU-bound."""
    summary = storage_run(0, cpu={"process_cpu_pct": 190.0, "workers_cpu_pct": 0.0})
    summary.probes.num_workers = NumWorkersProbe(suggested=0, reason="r")
    findings = {f.id: f for f in diagnose(summary)}
    assert "batched_transforms" not in findings
    assert findings["input_bound"].settings_change["num_workers"] >= 1


def test_zero_workers_computing_with_free_cores_get_a_worker():
    summary = computing_run(0, cpu_count=4, cpu={"process_cpu_pct": 100.0, "workers_cpu_pct": 0.0})
    assert workers_advised(summary) >= 1
    assert by_id(diagnose(summary), "batched_transforms") is None


def test_cpu_saturated_workers_get_batched_transforms_and_no_more_workers():
    findings = {f.id: f for f in diagnose(computing_run(1))}
    assert findings["batched_transforms"].settings_change == {"batched_transforms": True}
    assert "computes 97.0% of its time" in findings["batched_transforms"].evidence
    assert "num_workers" not in findings["input_bound"].settings_change


def test_fast_loader_gets_no_workers_advice():
    summary = make(1.5, step_ms=100.0, wait_ms=1.5, num_workers=0, cpu_count=2)
    assert not any("num_workers" in f.settings_change for f in diagnose(summary))


def test_a_probe_never_lowers_the_workers_of_an_input_bound_run():
    summary = storage_run(4)
    summary.probes.num_workers = NumWorkersProbe(suggested=1, reason="r")
    advice = suggest_workers(summary)
    workers, why = advice.count, advice.why
    assert workers is None and "nothing faster than 4" in why
    assert by_id(diagnose(summary), "workers_exceed_cores") is None


def test_a_probe_that_measured_fewer_workers_faster_lowers_them():
    summary = storage_run(4)
    rates = {0: 30.0, 1: 80.0, 2: 70.0, 4: 60.0}
    candidates = [{"num_workers": n, "status": "measured", "batches_per_sec": r} for n, r in rates.items()]
    summary.probes.num_workers = NumWorkersProbe(candidates=candidates, suggested=1, reason="r")
    advice = suggest_workers(summary)
    workers, why = advice.count, advice.why
    assert workers == 1 and why.startswith("measured by the num_workers probe")


def test_a_disturbed_probe_gives_no_settings_change_and_no_fallback_estimate():
    summary = storage_run(0)
    summary.probes.num_workers = NumWorkersProbe(
        reason="r", disturbed=True, machine_note="other processes used 1.9 of 2 cores"
    )
    advice = suggest_workers(summary)
    workers, why = advice.count, advice.why
    assert (
        workers is None and not advice.measured and why.startswith("not measured") and "1.9 of 2 cores" in why
    )
    found = by_id(diagnose(summary), "input_bound")
    assert found.settings_change == {} and "No workers count is advised (not measured" in found.recommendation


def test_same_advice_from_a_json_round_trip():
    summary = storage_run(2)
    again = RunSummary.from_dict(json.loads(json.dumps(summary.to_dict())))
    assert workers_advised(again) == workers_advised(summary)


# --- a busy machine -------------------------------------------------------------------------------------


def busy(summary: RunSummary, other: float, queue_pct: float | None) -> RunSummary:
    summary.machine = MachineState(
        wall_s=30.0, cpu_count=2, own_cores=0.3, other_cores=other, train_thread_runqueue_pct=queue_pct
    )
    return summary


def test_others_holding_the_cores_lead_and_withhold_the_cpu_bound_verdict():
    summary = busy(computing_run(1), other=1.8, queue_pct=45.0)
    findings = diagnose(summary)
    assert findings[0].id == "noisy_machine" and findings[0].severity == "high"
    assert findings[0].title == HELD_TITLE and "waited for a core 45.0% of the run" in findings[0].evidence
    assert by_id(findings, "batched_transforms") is None
    assert "CPU-bound" not in by_id(findings, "workers_saturated").title


def test_slow_storage_on_a_busy_machine_still_gets_workers_with_the_machine_first():
    findings = diagnose(busy(storage_run(0), other=1.9, queue_pct=40.0))
    assert findings[0].id == "noisy_machine" and findings[0].severity == "high"
    assert by_id(findings, "input_bound").settings_change["num_workers"] >= 2


def test_an_in_memory_fetch_lifted_by_busy_cores_gets_no_workers_without_a_measured_hand_off():
    """Beside busy cores a 0-worker in-memory fetch that lost its core now and then (median 0.15 ms, mean 6 ms,
    as read beside four CPU hogs) looks like waiting; with no hand-off measured it is no reason for a worker (a CI
    run under load was told `num_workers=1, persistent_workers=True` for in-memory data)."""
    summary = busy(storage_run(0), other=1.9, queue_pct=40.0)
    lifted = dataclasses.replace(summary.timing.data_wait_ms, mean=6.0, median=0.15, p90=23.0, max=140.0)
    summary.timing = dataclasses.replace(summary.timing, data_wait_ms=lifted)
    found = by_id(diagnose(summary), "input_bound")
    assert "num_workers" not in found.settings_change and "persistent_workers" not in found.settings_change
    assert "its median" in found.recommendation and "keep 0 workers" in found.recommendation
    # the same mean on a quiet machine is the fetch's own cost: the estimate stands
    quiet = storage_run(0)
    quiet.timing = dataclasses.replace(quiet.timing, data_wait_ms=lifted)
    assert workers_advised(quiet) is not None


def test_others_on_cores_the_run_did_not_need_do_not_lead():
    """Busy counters alone: another process on an idle core costs the run nothing (no run-queue wait)."""
    summary = busy(storage_run(0), other=0.9, queue_pct=1.0)
    assert machine_busy(summary) is None
    assert by_id(diagnose(summary), "noisy_machine").severity == "low"
    # others on three quarters of the cores or more lead whatever the run queue (a sleeping thread is woken first)
    assert machine_busy(busy(storage_run(0), other=1.6, queue_pct=3.0)) is not None
    assert machine_busy(busy(storage_run(0), other=1.6, queue_pct=None)) is not None
    assert machine_busy(busy(storage_run(0), other=1.2, queue_pct=None)) is None


def test_a_machine_held_by_others_still_names_a_gpu_held_at_its_power_cap():
    summary = busy(storage_run(0), other=1.9, queue_pct=40.0)
    summary.machine.gpu_slowdown_pct = {"power cap": 100.0}
    summary.machine.gpu_sm_clock_mhz, summary.machine.gpu_sm_clock_max_mhz = 1100.0, 1980.0
    first = diagnose(summary)[0]
    assert first.title == HELD_TITLE and "power cap in 100.0% of the training samples" in first.evidence
    assert "nvidia-smi" in first.recommendation


def test_waiting_workers_at_the_cap_are_told_to_speed_up_the_storage_not_to_add_cores():
    finding = by_id(diagnose(storage_run(16, cpu_count=2)), "input_bound")
    assert finding.settings_change == {}
    assert "storage faster" in finding.recommendation and "more CPU cores" not in finding.recommendation
