"""The num_workers probe on real DataLoaders: suggestions, no side effects, no leaked workers."""

from __future__ import annotations

import dataclasses
import gc
import json
import random
import time

import psutil
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset, SequentialSampler

from lightning_perf.analysis.diagnosis import diagnose
from lightning_perf.analysis.summary import RunSummary, Settings, TimingSummary
from lightning_perf.probes.num_workers import (
    REPEATS,
    NumWorkersProbe,
    candidate_counts,
    probe_num_workers,
    suggest_from_candidates,
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
        assert candidate["error"] is None
        assert candidate["startup_ms"] > 0 and candidate["batches"] > 0 and candidate["batches_per_sec"] > 0
    assert elapsed < 3 * BUDGET_S
    # stored in the run summary (as JSON would hold it), the diagnosis recommends the measured value
    summary = RunSummary(
        timing=TimingSummary(data_wait_pct=80.0),
        settings=Settings(num_workers=0),
        probes={"num_workers": dataclasses.asdict(result)},
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
    assert "at least 1.2x the model's 1.0 batches/s" in result.reason


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
    assert result.suggested is None
    assert "no candidate delivered batches" in result.reason and "corrupt sample" in result.reason


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
    assert set(data["candidates"][0]) == {
        "num_workers",
        "startup_ms",
        "batches_per_sec",
        "repeat_rates",
        "batches",
        "error",
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
        (40.0, 0, "at least 1.2x"),  # needs 48: the main process delivers 50
        (41.7, 2, "at least 1.2x"),  # needs 50.04: 50 is not enough
        (90.0, 2, "cannot keep up"),  # needs 108: none does, the fastest is suggested
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
        "no candidate delivered batches: boom",
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
