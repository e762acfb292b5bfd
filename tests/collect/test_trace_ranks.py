"""The trace_ranks policy: which ranks record traces, for many job layouts, and its validation."""

import logging

import pytest

from lightning_perf import PerfCallback
from lightning_perf.collect.config import PerfConfig
from lightning_perf.collect.profiling.trace_ranks import (
    AUTO_ALL_RANKS,
    describe,
    node_starts,
    ranks_to_trace,
    validate,
)
from lightning_perf.errors import ConfigError
from tests.helpers import TinyModel, loader, trace_files, trainer


@pytest.mark.parametrize("world_size", [1, 2, 3, 7, AUTO_ALL_RANKS])
@pytest.mark.parametrize("ranks_per_node", [1, 2, 4, 8])
def test_auto_traces_every_rank_of_a_small_job(world_size, ranks_per_node):
    assert ranks_to_trace(world_size, ranks_per_node) == set(range(world_size))


@pytest.mark.parametrize(
    ("world_size", "ranks_per_node", "expected"),
    [
        (9, 1, set(range(9))),  # nine single-rank nodes: every rank is its node's first
        (16, 8, {0, 8, 15}),  # two 8-GPU nodes
        (16, 4, {0, 4, 8, 12, 15}),
        (16, 16, {0, 15}),  # one big node
        (32, 8, {0, 8, 16, 24, 31}),
        (512, 8, set(range(0, 512, 8)) | {511}),  # 64 nodes: 65 traces instead of 512
        (12, 5, {0, 5, 10, 11}),  # a last node with fewer ranks
    ],
)
def test_auto_above_eight_ranks_traces_rank_zero_each_nodes_first_and_the_last(
    world_size, ranks_per_node, expected
):
    assert ranks_to_trace(world_size, ranks_per_node, "auto") == expected


def test_uneven_nodes_given_by_their_first_ranks():
    # nodes of 4, 8 and 6 ranks
    assert ranks_to_trace(18, [0, 4, 12], "auto") == {0, 4, 12, 17}
    assert node_starts(18, [4, 12, 40]) == [0, 4, 12]  # rank 0 always starts a node; 40 is not in the job


@pytest.mark.parametrize("world_size", [1, 4, 9, 64])
def test_all_traces_every_rank(world_size):
    assert ranks_to_trace(world_size, 8, "all") == set(range(world_size))


def test_a_list_traces_exactly_those_ranks():
    assert ranks_to_trace(64, 8, [3, 1, 3]) == {1, 3}
    assert ranks_to_trace(2, 1, [1]) == {1}
    assert ranks_to_trace(2, 1, 1) == {1}  # one rank on its own, as a list of one


def test_a_listed_rank_the_job_lacks_is_an_error_naming_it():
    with pytest.raises(ConfigError, match=r"`trace_ranks` names rank\(s\) 4, 9, but this job has 4 rank"):
        ranks_to_trace(4, 2, [0, 4, 9])


@pytest.mark.parametrize("bad", ["some", "", [], [-1], [1.5], [True], {"a": 1}, 2.0, None, ["0"]])
def test_bad_settings_fail_at_construction_naming_the_argument(bad):
    with pytest.raises(ConfigError, match="`trace_ranks`"):
        PerfCallback(trace_ranks=bad)


def test_settings_are_normalised():
    assert validate("AUTO") == "auto" and validate("all") == "all"
    assert validate([5, 2, 5]) == (2, 5)
    assert PerfConfig(trace_ranks=[3, 0]).trace_ranks == (0, 3)
    assert PerfCallback().config.trace_ranks == "auto"


def test_describe_names_ranks_as_ranges():
    assert describe({0, 8, 9, 10, 15}, 16) == "ranks 0, 8-10, 15 of 16"
    assert describe({1}, 2) == "rank 1 of 2"
    assert describe({0, 1}, 2) == "all 2 ranks"
    assert describe({0}, 1) == "rank 0"


def test_a_single_process_fit_records_its_traced_ranks_in_the_summary(tmp_path):
    callback = PerfCallback(
        skip_first=1, wait=0, warmup=1, active=2, probe_num_workers="never", diagnose=False
    )
    trainer(tmp_path, [callback], limit_train_batches=8).fit(TinyModel(), loader())
    assert callback.last_summary.trace_ranks == [0] and len(trace_files(tmp_path)) == 1


def test_a_listed_rank_missing_from_the_job_fails_before_the_first_batch(tmp_path):
    model = TinyModel()
    with pytest.raises(ConfigError, match=r"names rank\(s\) 1, but this job has 1 rank"):
        trainer(tmp_path, [PerfCallback(trace_ranks=[1])], limit_train_batches=4).fit(model, loader())
    assert model.seen_batches == 0


def test_without_the_profiler_no_rank_traces(tmp_path):
    callback = PerfCallback(enable_profiler=False, trace_ranks=[5], probe_num_workers="never", diagnose=False)
    trainer(tmp_path, [callback], limit_train_batches=4).fit(TinyModel(), loader())
    assert callback.last_summary.trace_ranks == [] and trace_files(tmp_path) == []


def test_the_trace_budget_warning_names_the_rank_and_the_ranks_that_record(tmp_path, caplog):
    from lightning_perf.collect.profiling.profiler_window import ProfilerWindow

    recording = describe(ranks_to_trace(16, 8), 16)
    window = ProfilerWindow(
        PerfConfig(max_trace_mb=1), ("cpu",), str(tmp_path), global_rank=8, world_size=16, recording=recording
    )
    window.bytes_written = 2_000_000  # past the cap: the next cycle is not started
    with caplog.at_level(logging.WARNING):
        assert window._over_budget()
    assert "on rank 8 (traces are recorded by ranks 0, 8, 15 of 16)" in caplog.text
    assert "`max_trace_mb` (1 MB)" in caplog.text
