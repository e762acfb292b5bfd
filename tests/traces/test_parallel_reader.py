"""``lightning-perf report --jobs N`` on a folder of many ranks' traces: a pool of processes, one trace each at a
time, the same report as in one process, ordered by rank."""

from __future__ import annotations

import json
import os

import pytest

from lightning_perf import cli
from lightning_perf.traces.read.parallel_reader import check_jobs, default_jobs, map_traces
from lightning_perf.traces.read.reader import TraceError, rewrite_trace
from lightning_perf.traces.report.build import build_report, find_traces

# file names whose order is not the ranks' order (rank-10 sorts before rank-2)
RANKS = (10, 2, 1)
WORLD = 11


@pytest.fixture(scope="module")
def many_ranks(realtraces, tmp_path_factory) -> str:
    """Three ranks of a real DDP trace (rank and world size rewritten) and one cut file."""
    (source,) = find_traces(str(realtraces / "ddp_a100_rank0"))
    folder = tmp_path_factory.mktemp("ranks")
    for rank in RANKS:
        rewrite_trace(source, folder / f"rank-{rank}.json.gz", global_rank=rank, world_size=WORLD)
    data = (folder / "rank-1.json.gz").read_bytes()
    (folder / "rank-5.pt.trace.json.gz").write_bytes(data[: len(data) // 3])
    return str(folder)


def report_json(capsys, folder: str, *argv: str) -> tuple[int, str]:
    code = cli.main(["report", folder, "--format", "json", *argv])
    return code, capsys.readouterr().out


def test_jobs_1_and_2_give_the_same_report_ordered_by_rank(many_ranks, capsys):
    code_1, out_1 = report_json(capsys, many_ranks, "--jobs", "1")
    code_2, out_2 = report_json(capsys, many_ranks, "--jobs", "2")
    assert out_1 == out_2
    assert code_1 == code_2 == 1  # the cut file
    report = json.loads(out_2)
    assert [t["rank"] for t in report["traces"]] == sorted(RANKS)
    assert [t["world_size"] for t in report["traces"]] == [WORLD] * len(RANKS)
    assert [row["rank"] for row in report["ranks"]["rows"]] == sorted(RANKS)
    (bad,) = report["unreadable"]
    assert bad["file"] == "rank-5.pt.trace.json.gz" and "truncated" in bad["error"]
    # the same figures on every rank: one trace copied, only its rank rewritten
    figures = [{**t["figures"], "rank": None} for t in report["traces"]]
    assert [t["figures"]["rank"] for t in report["traces"]] == sorted(RANKS)
    assert len({json.dumps(f, sort_keys=True) for f in figures}) == 1


def test_the_pool_gives_results_and_errors_in_the_order_of_the_paths(many_ranks):
    paths = sorted(os.path.join(many_ranks, name) for name in os.listdir(many_ranks))
    results = list(map_traces(os.path.getsize, paths, jobs=2))
    assert results == [(path, True, os.path.getsize(path)) for path in paths]
    missing = [*paths[:1], os.path.join(many_ranks, "gone.json")]
    found = list(map_traces(os.path.getsize, missing, jobs=2, errors=(OSError,)))
    assert found[0][1] is True and found[1][:2] == (missing[1], False) and "gone.json" in found[1][2]
    with pytest.raises(FileNotFoundError):  # an error not listed propagates
        list(map_traces(os.path.getsize, missing, jobs=2, errors=(TraceError,)))


@pytest.mark.parametrize("text", ["0", "-3", "two", "1.5"])
def test_bad_jobs_is_an_error_naming_the_flag(many_ranks, capsys, text):
    with pytest.raises(SystemExit) as info:
        cli.main(["report", many_ranks, "--jobs", text])
    assert info.value.code == 2
    assert "--jobs must be a positive integer" in capsys.readouterr().err


@pytest.mark.parametrize("jobs", [0, -1, 1.0, True, "2"])
def test_build_report_rejects_bad_jobs_naming_the_argument(many_ranks, jobs):
    with pytest.raises(ValueError, match="jobs must be an int >= 1"):
        build_report(many_ranks, jobs=jobs)


def test_default_jobs_is_the_usable_cores():
    assert check_jobs(None) == default_jobs() == len(os.sched_getaffinity(0))
    assert check_jobs(3) == 3


def test_the_reading_processes_end_when_the_process_that_started_them_is_killed():
    """A TensorBoard serving the Perf tab, stopped while its pool was open, left its reading processes waiting on
    their queue for ever (six of ~170 MB each); now each ends within about a second of its parent."""
    import signal
    import subprocess
    import sys
    import time

    import psutil

    script = (
        "import os, time\n"
        "from lightning_perf.traces.read.parallel_reader import _pool\n"
        "pool = _pool(2)\n"
        "print(sorted({pool.submit(os.getpid).result() for _ in range(8)}), flush=True)\n"
        "time.sleep(120)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        workers = [psutil.Process(pid) for pid in json.loads(owner.stdout.readline())]
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(w.is_running() and w.status() != "zombie" for w in workers):
        time.sleep(0.2)
    assert not [w.pid for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
