"""The num_workers probe on real DataLoaders: suggestions, no side effects, no leaked workers.

The machine watch is quiet in every test but the one about a busy machine: a probe that finds the machine busy
chooses nothing, and these tests run beside others on a small machine.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import random
import time
from types import SimpleNamespace

import psutil
import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    SequentialSampler,
    get_worker_info,
)

from lightning_perf.analysis.diagnosis import diagnose
from lightning_perf.analysis.probe_results import Probes
from lightning_perf.analysis.summary import Finding, RunSummary, Settings, TimingSummary
from lightning_perf.probes import num_workers, worker_counts
from lightning_perf.probes.num_workers import REPEATS, NumWorkersProbe, probe_num_workers
from lightning_perf.probes.worker_choice import predicted_wait_ms, suggest_from_candidates
from lightning_perf.probes.worker_counts import (
    WAITING_WORKERS_MAX,
    candidate_counts,
    probe_counts,
    waiting_workers_max,
)

SAMPLE_SLEEP_S = 0.005  # 5 ms a sample, 20 ms a batch of 4: about 50 batches/s per worker
BUDGET_S = 2.0  # three fresh starts of three candidates: about 0.2 s each


class SlowDataset(Dataset):
    def __init__(self, length: int = 64, sleep_s: float = SAMPLE_SLEEP_S, fail_at: int | None = None) -> None:
        self.length, self.sleep_s, self.fail_at = length, sleep_s, fail_at

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.fail_at is not None and index >= self.fail_at:
            raise OSError(f"corrupt sample {index}")
        time.sleep(self.sleep_s)
        return torch.full((3,), float(index))


class SlowStream(IterableDataset):
    def __init__(self, length: int, sleep_s: float = 0.0) -> None:
        self.length, self.sleep_s = length, sleep_s

    def __iter__(self):
        for index in range(self.length):
            time.sleep(self.sleep_s)
            yield torch.tensor([float(index)])


class WorkerOnlySleep(Dataset):
    """Instant in the main process, ``sleep_s`` a sample in a worker: the worker candidates time out."""

    def __init__(self, length: int = 16, sleep_s: float = 1.0) -> None:
        self.length, self.sleep_s = length, sleep_s

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        if get_worker_info() is not None:
            time.sleep(self.sleep_s)
        return torch.full((3,), float(index))


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    """Other processes on the test machine must not make the probe withhold its choice (tested apart)."""
    monkeypatch.setattr(num_workers, "noisy_machine", lambda summary, verdict: None)


def children() -> set[psutil.Process]:
    return set(psutil.Process().children(recursive=True))


def run_probe(*args, **kwargs) -> NumWorkersProbe:
    """The probe, checked for leaked workers the moment it returns, with no garbage collection to help.

    Processes alive before (e.g. multiprocessing's resource tracker after a DDP spawn test) are not leaks.
    """
    before = children()
    gc.disable()
    try:
        result = probe_num_workers(*args, **kwargs)
        assert children() - before == set(), "the probe left worker processes behind"
    finally:
        gc.enable()
    return result


def test_fast_model_needs_workers():
    loader = DataLoader(SlowDataset(), batch_size=4)
    start = time.perf_counter()
    result = run_probe(loader, compute_ms_per_batch=0.1, budget_s=BUDGET_S, max_workers=2)
    elapsed = time.perf_counter() - start
    assert result.suggested is not None and result.suggested > 0
    assert result.compute_batches_per_sec == pytest.approx(10000.0)
    assert "cannot keep up" in result.reason  # no loader reaches 12000 batches/s
    assert [c["num_workers"] for c in result.candidates] == [0, 1, 2]
    for candidate in result.candidates:
        assert candidate["error"] is None and candidate["status"] == "measured"
        assert candidate["predicted_step_ms"] == pytest.approx(0.1 + candidate["predicted_wait_ms"])
        assert candidate["startup_ms"] > 0 and candidate["batches"] > 0 and candidate["batches_per_sec"] > 0
    assert elapsed < 3 * BUDGET_S
    # stored in the run summary (as JSON would hold it), the diagnosis recommends the measured value
    summary = RunSummary(
        timing=TimingSummary(data_wait_pct=80.0),
        settings=Settings(num_workers=0),
        probes=Probes(num_workers=result),
    )
    finding = next(f for f in diagnose(summary) if f.id == "input_bound")
    assert finding.settings_change == {"num_workers": result.suggested}
    assert "cannot keep up" in finding.recommendation


def test_slow_model_needs_no_workers():
    loader = DataLoader(SlowDataset(), batch_size=4)
    result = run_probe(loader, compute_ms_per_batch=1000.0, budget_s=BUDGET_S, max_workers=2)
    assert result.suggested == 0
    # the main process already beats 1.2 batches/s, so larger values are not tried
    assert [c["num_workers"] for c in result.candidates] == [0]
    # 0 workers: ~20 ms of loading a step, never overlapped, is ~2% of a ~1020 ms step
    assert "num_workers=0 delivers" in result.reason and "below 5%" in result.reason
    assert result.candidates[0]["predicted_wait_ms"] == pytest.approx(
        result.candidates[0]["predicted_step_ms"] - 1000.0
    )


def test_user_dataloader_and_random_state_are_unchanged():
    generator = torch.Generator().manual_seed(7)
    loader = DataLoader(SlowDataset(length=16, sleep_s=0.0), batch_size=4, shuffle=True, generator=generator)
    attributes = dict(vars(loader))
    generator_state = generator.get_state()
    torch_state, python_state = torch.get_rng_state(), random.getstate()

    run_probe(loader, compute_ms_per_batch=0.01, budget_s=0.5, max_workers=1)

    assert vars(loader) == attributes
    assert loader.num_workers == 0 and loader._iterator is None
    assert torch.equal(generator.get_state(), generator_state)
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert random.getstate() == python_state


def test_a_failing_fetch_is_recorded_and_workers_are_shut_down():
    loader = DataLoader(SlowDataset(length=64, sleep_s=0.0, fail_at=9), batch_size=4)
    result = run_probe(loader, compute_ms_per_batch=1.0, budget_s=BUDGET_S, max_workers=2)
    assert [c["num_workers"] for c in result.candidates] == [0, 1, 2]
    assert all("corrupt sample" in c["error"] and c["batches_per_sec"] is None for c in result.candidates)
    assert all(c["status"] == "not measured" and c["predicted_step_ms"] is None for c in result.candidates)
    assert result.suggested is None
    assert "no candidate was measured" in result.reason
    assert "num_workers=0: not measured (OSError: corrupt sample 9)" in result.reason
    # a worker's error carries its traceback: the reason keeps its first and last lines
    assert "num_workers=1, 2: not measured (OSError: Caught OSError in DataLoader worker" in result.reason
    assert "\n" not in result.reason


def test_short_dataset_is_restarted_for_more_batches():
    loader = DataLoader(SlowDataset(length=8, sleep_s=0.0), batch_size=4)  # 2 batches an epoch
    result = run_probe(loader, compute_ms_per_batch=0.001, budget_s=BUDGET_S, max_workers=1)
    assert all(c["batches"] > 2 and c["error"] is None for c in result.candidates)


def test_iterable_dataset():
    loader = DataLoader(SlowStream(length=10), batch_size=4)  # 3 batches an epoch, the last one short
    result = run_probe(loader, compute_ms_per_batch=0.001, budget_s=BUDGET_S, max_workers=1)
    assert [c["num_workers"] for c in result.candidates] == [0, 1]
    assert all(c["batches"] > 3 and c["error"] is None for c in result.candidates)
    assert "IterableDataset" in result.reason and "replays" in result.reason


def test_user_batch_sampler_is_reused():
    sampler = BatchSampler(SequentialSampler(range(12)), batch_size=3, drop_last=True)
    loader = DataLoader(SlowDataset(length=12, sleep_s=0.0), batch_sampler=sampler)
    result = run_probe(loader, compute_ms_per_batch=None, budget_s=0.5, max_workers=0)
    assert [c["num_workers"] for c in result.candidates] == [0]
    assert result.candidates[0]["error"] is None and result.suggested == 0
    assert "no compute rate measured" in result.reason


def test_result_is_json_serialisable():
    loader = DataLoader(SlowDataset(length=8, sleep_s=0.0), batch_size=4)
    result = run_probe(loader, compute_ms_per_batch=5.0, budget_s=0.5, max_workers=1)
    data = json.loads(json.dumps(dataclasses.asdict(result)))
    assert data["suggested"] == result.suggested
    assert data["loading_waits"] is False and data["disturbed"] is False
    assert set(data["candidates"][0]) == {
        "num_workers",
        "status",
        "startup_ms",
        "batches_per_sec",
        "repeat_rates",
        "batches",
        "error",
        "predicted_wait_ms",
        "predicted_step_ms",
        "settled",
    }
    assert NumWorkersProbe(**data) == result


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"dataloader": [1, 2, 3]}, "dataloader"),
        ({"budget_s": 0}, "budget_s"),
        ({"budget_s": -1.0}, "budget_s"),
        ({"budget_s": float("nan")}, "budget_s"),
        ({"max_workers": -1}, "max_workers"),
        ({"max_workers": 1.5}, "max_workers"),
        ({"compute_ms_per_batch": 0.0}, "compute_ms_per_batch"),
        ({"margin": 0.0}, "margin"),
        ({"loading_waits": "yes"}, "loading_waits"),
    ],
)
def test_invalid_arguments_name_the_argument(kwargs, name):
    arguments = {"dataloader": DataLoader(SlowDataset(length=4)), "compute_ms_per_batch": 1.0, **kwargs}
    with pytest.raises(ValueError, match=f"^{name}:"):
        probe_num_workers(**arguments)


@pytest.mark.parametrize(
    ("cores", "counts"),
    [
        (0, [0]),
        (1, [0, 1]),
        (2, [0, 1, 2]),
        (6, [0, 1, 2, 4, 6]),
        (8, [0, 1, 2, 4, 8]),
        (12, [0, 1, 2, 4, 8, 12]),
    ],
)
def test_candidate_counts(cores, counts):
    assert candidate_counts(cores) == counts


def rates(*values):
    return [
        {"num_workers": n, "batches_per_sec": v, "error": None}
        for n, v in zip((0, 1, 2, 4), values, strict=False)
    ]


@pytest.mark.parametrize(
    ("compute_rate", "suggested", "phrase"),
    [
        (66.7, 2, "at least 1.2x"),  # needs 80 batches/s
        (80.0, 2, "at least 1.2x"),  # needs 96: 100 is enough
        # needs 48: the main process delivers 50, but its 20 ms of loading is 44% of its 45 ms step
        (40.0, 1, "at least 1.2x"),
        (41.7, 2, "at least 1.2x"),  # needs 50.04: 49 is not enough
        # needs 108: none does; the shortest predicted step is suggested, and 100 batches/s leave no wait
        (90.0, 2, "no measured value keeps up"),
        (1.0, 0, "below 5%"),  # 20 ms of loading in a 1020 ms step: 0 workers hide nothing worth a process
    ],
)
def test_suggestion_is_the_smallest_that_beats_compute_with_margin(compute_rate, suggested, phrase):
    chosen, reason = suggest_from_candidates(rates(50.0, 49.0, 100.0), compute_rate, margin=1.2)
    assert chosen == suggested
    assert phrase in reason


def test_suggestion_without_compute_rate_is_the_smallest_near_the_fastest():
    assert suggest_from_candidates(rates(50.0, 49.0, 100.0), None, margin=1.2)[0] == 2
    assert suggest_from_candidates(rates(90.0, 95.0, 100.0), None, margin=1.2)[0] == 0


def test_suggestion_skips_failed_candidates():
    candidates = rates(50.0, None, 100.0)
    candidates[1]["error"] = "RuntimeError: boom"
    assert suggest_from_candidates(candidates, 70.0)[0] == 2
    assert suggest_from_candidates([{"num_workers": 0, "batches_per_sec": None, "error": "boom"}], 1.0) == (
        None,
        "no candidate was measured, so no value is chosen: num_workers=0: not measured (boom)",
    )


def test_budget_running_out_stops_the_sweep_and_says_so():
    loader = DataLoader(SlowDataset(length=8, sleep_s=0.05), batch_size=1)  # one batch outlasts the budget
    result = run_probe(loader, compute_ms_per_batch=1.0, budget_s=0.01, max_workers=2)
    assert [c["num_workers"] for c in result.candidates] == [0]
    assert result.candidates[0]["batches"] == 1 and result.suggested == 0
    assert "cannot keep up" in result.reason and "ran out before num_workers=1" in result.reason


def test_budget_fits_the_run_between_floor_and_cap():
    from lightning_perf.probes.num_workers import BUDGET_SHARE, probe_budget

    assert probe_budget(1.75, 10.0, "auto") is None  # a 1.75 s fit is too short for a verdict
    assert probe_budget(30.0, 10.0, "auto") == pytest.approx(30.0 * BUDGET_SHARE)
    assert probe_budget(3600.0, 10.0, "auto") == 10.0  # the user's cap
    # asked for: the whole budget the user set, whatever the fit's length
    assert probe_budget(1.75, 10.0, "always") == 10.0
    assert probe_budget(None, 3.0, "always") == 3.0


def test_each_candidate_is_timed_in_fresh_starts_whose_slowest_must_clear_the_model():
    loader = DataLoader(SlowDataset(length=12, sleep_s=0.002), batch_size=2)
    # a cap, not a duration: 12 samples take ~25 ms; each fresh start of a worker can take 0.3 s on a busy
    # machine, and with 1 s the third start of num_workers=1 was cut off once in CI
    result = run_probe(loader, compute_ms_per_batch=1.0, budget_s=20.0, max_workers=1)
    for candidate in result.candidates:
        assert len(candidate["repeat_rates"]) == REPEATS
        assert (
            min(candidate["repeat_rates"]) <= candidate["batches_per_sec"] <= max(candidate["repeat_rates"])
        )
    # 6 batches an epoch: every start (and every restart when the data runs out) is a new iterator
    assert result.candidates[0]["batches"] > REPEATS * 6 / 2


def test_selection_needs_the_slowest_start_to_clear_the_model():
    lucky = {"num_workers": 1, "batches_per_sec": 130.0, "repeat_rates": [200.0, 130.0, 60.0], "error": None}
    steady = {
        "num_workers": 2,
        "batches_per_sec": 125.0,
        "repeat_rates": [124.0, 125.0, 126.0],
        "error": None,
    }
    suggested, reason = suggest_from_candidates([lucky, steady], 100.0)
    assert suggested == 2  # one fast start of num_workers=1 does not make it keep up
    assert "even in its slowest start" in reason and "124.0-126.0 over 3 fresh starts" in reason


def test_loading_that_waits_tries_counts_past_the_cores(monkeypatch):
    monkeypatch.setattr(worker_counts, "usable_cpu_count", lambda: 2)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=2**50))
    # 1 ms of sleep a batch and 10 batches a fresh start: each start ends at its batch cap long before its
    # share of the budget, so every count is reached even when worker start-up is slow (~0.5 s for 8 workers
    # on a busy 2-core machine); the budget is a cap, not the test's duration (~1 s on a quiet machine)
    monkeypatch.setattr(num_workers, "MAX_BATCHES_PER_CANDIDATE", 10 * REPEATS)
    loader = DataLoader(SlowDataset(length=64, sleep_s=0.0005), batch_size=2)
    # the model wants 10^6 batches/s: no count keeps up, so every count is tried
    result = run_probe(loader, compute_ms_per_batch=0.001, budget_s=20.0, loading_waits=True)
    assert [c["num_workers"] for c in result.candidates] == [0, 1, 2, 4, 8]
    assert result.loading_waits is True and "ran out" not in result.reason
    assert all(c["status"] in ("measured", "not measured") for c in result.candidates)
    assert result.candidates[0]["status"] == "measured" and result.suggested is not None
    # the same loader without the caller's word stays at the cores
    quiet = run_probe(loader, compute_ms_per_batch=None, budget_s=0.5)
    assert [c["num_workers"] for c in quiet.candidates] == [0, 1, 2] and quiet.loading_waits is False


@pytest.mark.parametrize(
    ("cores", "loading_waits", "max_workers", "counts"),
    [
        (2, False, None, [0, 1, 2]),
        (2, True, None, [0, 1, 2, 4, 8]),  # at least 8
        (6, True, None, [0, 1, 2, 4, 6, 8, 16, 24]),  # 4 a core, the cores themselves kept
        (16, True, None, [0, 1, 2, 4, 8, 16, 32]),  # at most 32
        (64, True, None, [0, 1, 2, 4, 8, 16, 32, 64]),  # past 32 cores: the cores, as without waiting
        (2, True, 3, [0, 1, 2, 3]),  # the caller's max_workers wins
    ],
)
def test_probe_counts(monkeypatch, cores, loading_waits, max_workers, counts):
    monkeypatch.setattr(worker_counts, "usable_cpu_count", lambda: cores)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=2**50))
    assert probe_counts(max_workers, loading_waits) == (counts, "")
    assert waiting_workers_max(cores) <= WAITING_WORKERS_MAX


def test_probe_counts_stop_where_memory_runs_out(monkeypatch):
    monkeypatch.setattr(worker_counts, "usable_cpu_count", lambda: 2)
    rss = psutil.Process().memory_info().rss
    # room for about 5 workers of half this process's resident memory: 4 fits, 8 does not
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=5 * rss // 2))
    counts, note = probe_counts(None, True)
    assert counts == [0, 1, 2, 4]
    assert "stop before num_workers=8" in note and "estimated" in note


def test_a_timed_out_candidate_is_not_measured(monkeypatch):
    monkeypatch.setattr(num_workers, "MIN_WORKER_TIMEOUT_S", 0.2)
    loader = DataLoader(WorkerOnlySleep(sleep_s=1.0), batch_size=1)  # a worker's first batch takes 1 s
    result = run_probe(loader, compute_ms_per_batch=0.001, budget_s=0.3, max_workers=1)
    zero, one = result.candidates
    assert zero["status"] == "measured" and zero["batches_per_sec"] > 0
    assert one["status"] == "not measured" and one["batches_per_sec"] is None
    assert "timed out" in one["error"] and one["predicted_step_ms"] is None
    assert result.suggested == 0  # the only value measured
    assert "num_workers=1: not measured (RuntimeError: DataLoader timed out" in result.reason
    assert "nothing faster" not in result.reason and "not faster" not in result.reason


def test_unmeasured_larger_counts_are_named_never_slower():
    timed_out = "RuntimeError: DataLoader timed out after 1.67 seconds"
    candidates = [
        {"num_workers": 0, "status": "measured", "batches_per_sec": 50.0, "repeat_rates": [], "error": None},
        {"num_workers": 1, "status": "not measured", "batches_per_sec": None, "error": timed_out},
        {"num_workers": 2, "status": "not measured", "batches_per_sec": None, "error": timed_out},
    ]
    suggested, reason = suggest_from_candidates(candidates, 100.0)
    assert suggested == 0
    assert f"num_workers=1, 2: not measured ({timed_out})" in reason
    assert "nothing faster" not in reason and "not faster" not in reason
    # a rate without its status (a hand-built or older candidate) counts only without an error
    assert (
        suggest_from_candidates([{"num_workers": 0, "batches_per_sec": 50.0, "error": "x"}], 1.0)[0] is None
    )


def test_overlap_zero_workers_pays_every_load_inside_the_step():
    loader = DataLoader(SlowDataset(length=64, sleep_s=0.01), batch_size=2)  # ~20 ms a batch, ~50 batches/s
    # the model computes 20 batches/s: num_workers=0 delivers over twice that, but its ~20 ms of loading are
    # paid inside every 50 ms step, while one worker loads beside the step
    result = run_probe(loader, compute_ms_per_batch=50.0, budget_s=2.0, max_workers=2)
    zero, one = result.candidates[:2]
    assert zero["batches_per_sec"] > 24.0  # the old rule (1.2x the model's rate) would have chosen 0
    assert zero["predicted_wait_ms"] > 0.05 * zero["predicted_step_ms"]
    assert one["predicted_step_ms"] < zero["predicted_step_ms"]
    assert result.suggested in (1, 2)
    assert "with num_workers=0 (no overlap)" in result.reason


def test_predicted_wait_with_and_without_overlap():
    zero = {"num_workers": 0, "batches_per_sec": 60.0, "repeat_rates": [50.0, 60.0, 70.0], "error": None}
    one = {"num_workers": 1, "batches_per_sec": 60.0, "repeat_rates": [50.0, 60.0, 70.0], "error": None}
    assert predicted_wait_ms(zero, 10.0) == pytest.approx(20.0)  # the slowest start's 20 ms, in full
    assert predicted_wait_ms(one, 10.0) == 0.0  # 20 ms of loading beside a 100 ms step
    assert predicted_wait_ms(one, 100.0) == pytest.approx(10.0)  # 20 ms of loading, 10 ms of compute
    assert predicted_wait_ms(one, None) is None


def test_selection_compares_predicted_steps_when_none_keeps_up():
    # the model computes 1000 batches/s (1 ms): the main process loads 1000 batches/s, but in the step
    candidates = rates(1000.0, 900.0)
    suggested, reason = suggest_from_candidates(candidates, 1000.0)
    assert suggested == 1  # ~1.1 ms a step against 2 ms with num_workers=0
    assert "predicted wait 0.1 ms a step against 1.0 ms with num_workers=0 (no overlap)" in reason
    # within 5% of the shortest predicted step the smaller count is preferred
    assert suggest_from_candidates(rates(20.0, 30.0, 31.0), 40.0)[0] == 1  # 33.3 ms vs 32.3 ms
    assert suggest_from_candidates(rates(20.0, 30.0, 40.0), 40.0)[0] == 2  # 33.3 ms vs 25.0 ms
    # without a compute rate, 0 only when within the margin of the fastest
    assert suggest_from_candidates(rates(50.0, 100.0), None)[0] == 1


def test_a_busy_machine_chooses_nothing(monkeypatch):
    busy = Finding(
        id="noisy_machine",
        severity="low",
        title="busy",
        evidence="During the run other processes used 1.9 of 2 cores (95%); load average 3.10: timings may be "
        "off by up to ~95%.",
        recommendation="",
    )
    monkeypatch.setattr(num_workers, "noisy_machine", lambda summary, verdict: busy)
    loader = DataLoader(SlowDataset(length=16), batch_size=4)
    result = run_probe(loader, compute_ms_per_batch=1000.0, budget_s=0.5, max_workers=1)
    assert result.disturbed is True and result.suggested is None
    assert result.machine_note == "other processes used 1.9 of 2 cores (95%); load average 3.10"
    assert "measured on a busy machine (other processes used 1.9 of 2 cores" in result.reason
    assert "the rates are disturbed, so no value is chosen" in result.reason
    assert "num_workers=0: " in result.reason and "batches/s" in result.reason  # the rates are still listed
    assert result.candidates and result.candidates[0]["status"] == "measured"


class StallingDataset(Dataset):
    """Every 32nd sample a 100 ms read (a cold block of storage), the rest free: with batches of 8 in order,
    every 4th batch stalls, and with 4 or 8 workers the stalling batches all fall to one or two of them."""

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, index: int) -> torch.Tensor:
        if index % 32 == 0:
            time.sleep(0.1)
        return torch.zeros(4)


def long_read_rate(workers: int, seconds: float) -> float:
    """Batches/s of one long read, after the workers' start-up burst."""
    loader = DataLoader(StallingDataset(), batch_size=8, num_workers=workers)
    iterator = iter(loader)
    try:
        for _ in range(2 * workers + 1):
            next(iterator)
        begun, fetched = time.perf_counter(), 0
        while time.perf_counter() - begun < seconds:
            next(iterator)
            fetched += 1
        return fetched / (time.perf_counter() - begun)
    finally:
        iterator._shutdown_workers()


@pytest.mark.once  # ~20 s of sleeping loaders; nothing here depends on Lightning's version
def test_a_loader_that_stalls_now_and_then_is_read_until_its_rate_settles():
    # issue 42: short windows read 4 and 8 workers at 30 and 46 batches/s where a long read gives 40 and 79:
    # the windows held part of a stall cycle. Sleeping workers hardly use a core, so this holds on a busy machine.
    loader = DataLoader(StallingDataset(), batch_size=8)
    result = run_probe(loader, compute_ms_per_batch=0.001, budget_s=14.0, max_workers=8)
    rates = {c["num_workers"]: c["batches_per_sec"] for c in result.candidates}
    assert set(rates) == {0, 1, 2, 4, 8}, result.reason
    for workers in (4, 8):
        truth = long_read_rate(workers, seconds=3.0)
        assert rates[workers] >= 0.9 * truth, (workers, rates, truth)
        assert next(c for c in result.candidates if c["num_workers"] == workers)["settled"]
