"""The cross-rank exchange's own gloo group, on two real processes: gathered, then destroyed by ``close`` (what
the callback's teardown calls), so no gloo group of ours is left to the interpreter's exit."""

from __future__ import annotations

import json

import torch.distributed as dist
import torch.multiprocessing as mp

from lightning_perf.collect.rank_exchange import STEP_TIME_MS, WINDOW, RankReducer


def _gather_then_close(rank: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    reducer = RankReducer(timeout_s=30.0)
    group = reducer._group
    rows = reducer.gather(WINDOW, {STEP_TIME_MS: 10.0 + rank})
    reducer.close()
    reducer.close()  # twice: the second finds nothing to free
    try:
        registered = dist.get_process_group_ranks(group) == [0, 1]
    except (KeyError, ValueError, RuntimeError):  # the group is no longer known to torch.distributed
        registered = False
    after = reducer.gather(WINDOW, {STEP_TIME_MS: 1.0})
    dist.destroy_process_group()
    with open(f"{out}/rank{rank}.json", "w") as fh:
        json.dump({"rows": rows, "registered": registered, "after": after, "failed": reducer.failed}, fh)


def test_close_destroys_the_group_after_the_last_gather_on_every_rank(tmp_path):
    mp.start_processes(
        _gather_then_close, (str(tmp_path / "store"), str(tmp_path)), nprocs=2, start_method="spawn"
    )
    for rank in (0, 1):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result["rows"] == [{STEP_TIME_MS: 10.0}, {STEP_TIME_MS: 11.0}]
        assert result == {"rows": result["rows"], "registered": False, "after": None, "failed": True}


def test_close_on_a_single_process_is_a_no_op():
    reducer = RankReducer()
    reducer.close()
    assert not reducer.distributed and not reducer.failed
    assert reducer.gather(WINDOW, {STEP_TIME_MS: 3.0}) == [{STEP_TIME_MS: 3.0}]
