"""``lightning-perf report`` over generated small traces of every shape (issue 34, point 1): no kernels, kernels
only, CPU only, communication only (``gloo:``/``nccl:`` operators, NCCL kernels), mixed; correlation and External
id values of mixed types (int, str, missing). The report never raises, every trace is either read or listed as
unreadable with its rank and the reason, and every step's breakdown sums to its duration. A trace that the
analysis fails on, for any error, costs that trace, not the folder, with any ``--jobs``."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lightning_perf import cli
from lightning_perf.traces.figures.breakdown import CATEGORIES
from lightning_perf.traces.read.parallel_reader import map_traces
from lightning_perf.traces.report import build
from lightning_perf.traces.report.build import build_report
from lightning_perf.traces.report.render import render_markdown, render_text

SHAPES = ("no_kernels", "kernels_only", "cpu_only", "comm_only", "mixed")
CPU_OPS = ("aten::mm", "aten::add_", "autograd::engine::evaluate_function: MmBackward0")
COMM_OPS = ("gloo:all_reduce", "nccl:all_reduce", "nccl:broadcast")
KERNELS = ("sgemm", "void at::native::vectorized_elementwise_kernel<4>")
NCCL_KERNELS = ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ncclKernel_Broadcast_RING_LL_Sum_int8_t")
DATALOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
# a report rounds each of the eight categories to the microsecond (0.001 ms)
ROUNDING_MS = 8 * 0.0005 + 1e-9


def ident(kind: str, value: int) -> dict[str, Any] | Any:
    return {"int": value, "str": str(value), "missing": None}[kind]


@st.composite
def traces(draw: st.DrawFn, odd_ids: bool = False) -> dict[str, Any]:
    """One small trace: steps back to back, each with a few operators, launches and kernels by its shape."""
    shape = draw(st.sampled_from(SHAPES))
    id_kinds = st.sampled_from(("int", "str", "missing"))
    events: list[dict[str, Any]] = []

    def add(name: str, cat: str, ts: float, dur: float, pid: Any = 1, tid: Any = 1, **args: Any) -> None:
        kept = {k: v for k, v in args.items() if v is not None}
        events.append(
            {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": kept}
        )

    t, correlation = 0.0, 0
    for step in range(draw(st.integers(1, 3))):
        length = float(draw(st.integers(50, 2_000)))
        if shape != "kernels_only":
            add(f"ProfilerStep#{step}", "user_annotation", t, length)
        for _ in range(draw(st.integers(0, 4))):
            correlation += 1
            start = t + draw(st.integers(0, int(length) - 1))
            dur = float(draw(st.integers(0, int(t + length - start))))
            comm = shape == "comm_only" or (shape != "kernels_only" and draw(st.booleans()))
            name = draw(st.sampled_from(COMM_OPS if comm else CPU_OPS))
            if shape != "kernels_only":
                if shape != "comm_only" and draw(st.booleans()):
                    add(DATALOADER, "user_annotation", start, dur)
                    continue
                add(name, "cpu_op", start, dur, **{"External id": ident(draw(id_kinds), correlation)})
            if shape == "cpu_only" or name.startswith("gloo:"):  # gloo runs on the host
                continue
            if shape != "kernels_only":  # a launch; its kernel missing from a trace of no kernels
                add(
                    "cudaLaunchKernel",
                    "cuda_runtime",
                    start,
                    min(dur, 5.0),
                    correlation=ident(draw(id_kinds), correlation),
                )
            if shape == "no_kernels":
                continue
            kernel = draw(st.sampled_from(NCCL_KERNELS if comm else KERNELS))
            pid = draw(st.sampled_from([0, [0], {"device": 0}, "0"])) if odd_ids else 0
            ids = {"correlation": ident(draw(id_kinds), correlation)}
            ids["External id"] = ident(draw(id_kinds), correlation)
            add(kernel, "kernel", start + 1.0, float(draw(st.integers(1, 500))), pid=pid, tid=7, **ids)
        t += length + draw(st.integers(0, 50))
    return {"traceEvents": events}


# an event's pid a list: the report of the folder raised TypeError (unhashable type) before
UNHASHABLE_PID = {
    "traceEvents": [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "ts": 0,
            "dur": 100,
            "pid": 1,
            "tid": 1,
        },
        {"ph": "X", "cat": "kernel", "name": "sgemm", "ts": 10, "dur": 20, "pid": [0], "tid": 7},
    ]
}


def check_report(folder: str, ranks: list[int]) -> dict[str, Any]:
    """The report of ``folder``: it never raises, each trace is read or listed unreadable with its rank, and
    every step's categories sum to its duration."""
    report = build_report(folder, top=3, jobs=1)
    assert sorted([t["rank"] for t in report["traces"]] + [u["rank"] for u in report["unreadable"]]) == ranks
    assert all(u["error"] for u in report["unreadable"])
    for trace in report["traces"]:
        for step in trace["steps"]:
            assert set(step["categories_ms"]) == set(CATEGORIES)
            assert sum(step["categories_ms"].values()) == pytest.approx(step["duration_ms"], abs=ROUNDING_MS)
    for render in (render_text, render_markdown):
        render(report)
    return report


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(traces(odd_ids=True), min_size=1, max_size=3))
@example([UNHASHABLE_PID, {"traceEvents": []}])
def test_the_report_never_raises_and_each_step_sums_to_its_duration(made):
    # the last rank a plain CPU step: a folder with nothing readable is an error of its own (exit code 2)
    made = [*made, {"traceEvents": UNHASHABLE_PID["traceEvents"][:1]}]
    with tempfile.TemporaryDirectory() as folder:
        for rank, trace in enumerate(made):
            trace = {"distributedInfo": {"rank": rank, "world_size": len(made)}, **trace}
            with open(os.path.join(folder, f"host_rank{rank}.1.pt.trace.json"), "w") as fh:
                json.dump(trace, fh)
        report = check_report(folder, list(range(len(made))))
        assert len(made) - 1 in [t["rank"] for t in report["traces"]]


# a CPU ddp_spawn step: a gloo collective, no GPU kernel (crashed the step breakdown: an empty list or-ed into a bool mask)
GLOO_CPU_ONLY = {
    "traceEvents": [
        {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1, "args": {"External id": i}}
        for i, (name, cat, ts, dur) in enumerate(
            [("ProfilerStep#3", "user_annotation", 1000, 500), ("gloo:all_reduce", "cpu_op", 1100, 100),
             ("aten::mm", "cpu_op", 1250, 100)], start=1,
        )
    ]
}  # fmt: skip


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces())
@example(GLOO_CPU_ONLY)
def test_well_formed_traces_of_every_shape_are_read(trace):
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "host_rank3.1.pt.trace.json"), "w") as fh:
            json.dump(trace, fh)
        report = check_report(folder, [None])  # no distributedInfo: no rank
        assert report["unreadable"] == []


def write_ranks(folder, bad: dict[str, Any] | None = None) -> None:
    good = {"traceEvents": UNHASHABLE_PID["traceEvents"][:1]}
    for rank in range(3):
        trace = bad if rank == 1 and bad is not None else good
        head = {"distributedInfo": {"rank": rank, "world_size": 3}}
        (folder / f"worker{rank}.1.pt.trace.json").write_text(json.dumps({**head, **trace}))


def test_an_error_in_the_analysis_costs_that_trace_not_the_folder(tmp_path, monkeypatch, capsys):
    write_ranks(tmp_path)
    figures = build.trace_figures

    def fails_on_rank_1(parsed, breakdown):
        if parsed.rank == 1:
            raise RuntimeError("a figure nobody expected")
        return figures(parsed, breakdown)

    monkeypatch.setattr(build, "trace_figures", fails_on_rank_1)
    assert cli.main(["report", str(tmp_path), "--jobs", "1", "--format", "json"]) == 1
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert [t["rank"] for t in report["traces"]] == [0, 2]
    (bad,) = report["unreadable"]
    assert bad["file"] == "worker1.1.pt.trace.json" and bad["rank"] == 1
    assert "cannot be analysed: RuntimeError: a figure nobody expected" in bad["error"]
    assert "Traceback" not in err and "a figure nobody expected" in err
    assert "Unreadable: rank 1: worker1.1.pt.trace.json:" in render_text(report)


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_trace_that_crashed_the_folder_is_one_trace_with_any_jobs(tmp_path, capsys, jobs):
    write_ranks(tmp_path, bad=UNHASHABLE_PID)
    code = cli.main(["report", str(tmp_path), "--jobs", str(jobs), "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    read = [t["rank"] for t in report["traces"]]
    assert sorted(read + [u["rank"] for u in report["unreadable"]]) == [0, 1, 2]
    assert code == (1 if report["unreadable"] else 0) and {0, 2} <= set(read)


def test_the_rank_of_an_unreadable_trace_comes_from_its_head_or_name(tmp_path):
    head = tmp_path / "a.pt.trace.json"
    head.write_text(
        '{"distributedInfo": {"backend": "nccl", "rank": 12, "world_size": 16}, "traceEvents": [{"ph"'
    )
    named = tmp_path / "rank-5.json.gz"
    named.write_bytes(b"\x1f\x8b cut")
    nothing = tmp_path / "b.pt.trace.json"
    nothing.write_text("{")
    assert [build.unreadable_rank(str(p)) for p in (head, named, nothing)] == [12, 5, None]


def dies_on_cue(path: str) -> str:
    """A worker's task that kills its process on a file named ``dies`` (as the kernel's OOM killer would)."""
    if os.path.basename(path).startswith("dies"):
        os._exit(3)
    return os.path.basename(path)


def test_a_worker_that_dies_costs_its_file_not_the_others(tmp_path):
    names = ["a.json", "dies.json", "b.json", "c.json", "d.json"]
    paths = [str(tmp_path / name) for name in names]
    results = list(map_traces(dies_on_cue, paths, jobs=2))
    assert [path for path, _, _ in results] == paths  # every file, in order
    assert [(ok, value) for _, ok, value in results if ok] == [(True, n) for n in names if n != "dies.json"]
    (dead,) = [value for _, ok, value in results if not ok]
    assert "dies.json: the process reading it ended abruptly" in dead


def test_a_pid_that_is_a_list_is_read_not_unreadable(tmp_path):
    """A malformed pid (a list) is coded by its text: the trace is read, not lost."""
    head = {"distributedInfo": {"rank": 0, "world_size": 1}}
    (tmp_path / "host_rank0.1.pt.trace.json").write_text(json.dumps({**head, **UNHASHABLE_PID}))
    report = check_report(str(tmp_path), [0])
    assert report["unreadable"] == [] and report["traces"][0]["steps"]
