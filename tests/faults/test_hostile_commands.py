"""The commands on hostile folders and numbers (issue 36, point 8): ``report --jobs`` far above the cores, the
traces of two runs in one folder, broken links and FIFOs named like traces, ``capture`` on a log root, step
times of 1e308 ms in ``compare``, a comparison JSON missing a field. Each gets an answer that names what is
wrong, never a traceback, a silent skip or a process a trace."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from lightning_perf import cli
from lightning_perf.analysis.summary import SUMMARY_FILENAME, Distribution, RunSummary, TimingSummary
from lightning_perf.analysis.verdicts.comparison_render import from_json
from lightning_perf.collect.profiling.capture_request import REQUEST_FILENAME
from lightning_perf.traces.read import parallel_reader

# ---------------------------------------------------------------------------------------------- helpers


def write_trace(
    path: Path,
    rank: int | None,
    world: int | None,
    step_us: int = 10_000,
    steps: int = 3,
    pid: int = 7,
    start_us: int = 1_000_000,
) -> Path:
    """A small Kineto-like trace: ``steps`` ProfilerStep spans, each with a forward and a backward operator, run by
    process ``pid`` from ``start_us``."""
    events, ts = [], start_us
    for step in range(steps):
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": pid, "tid": 1, "ts": ts,
             "dur": step_us, "args": {}},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": pid, "tid": 1, "ts": ts + 10,
             "dur": step_us // 2, "args": {}},
            {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: MmBackward0", "pid": pid,
             "tid": 1, "ts": ts + step_us // 2 + 20, "dur": step_us // 4, "args": {}},
        ]  # fmt: skip
        ts += step_us + 100
    data: dict = {"schemaVersion": 1, "traceEvents": events}
    if rank is not None:
        data["distributedInfo"] = {"backend": "gloo", "rank": rank, "world_size": world}
    path.write_text(json.dumps(data))
    return path


def report(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["report", *map(str, argv)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def save_summary(directory: Path, samples: list[float]) -> Path:
    """A run's perf_summary.json with these per-step times (ms), however absurd: where their sum overflows, the
    step-time figures are all the largest sample (as a hand edit or a foreign tool could write them)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / SUMMARY_FILENAME
    try:
        figures = Distribution.of(samples)
    except OverflowError:
        figures = None
    ordinary = figures or Distribution.of([1.0] * len(samples))
    timing = TimingSummary(steps=len(samples), samples=4 * len(samples), step_time_ms=ordinary)
    timing.step_samples_ms = list(samples)
    RunSummary(run_name=directory.name, timing=timing).save(path)
    if figures is None:
        data = json.loads(path.read_text())
        stats = data["timing"]["step_time_ms"]
        stats.update({key: max(samples) for key, value in stats.items() if isinstance(value, float)})
        path.write_text(json.dumps(data))
    return directory


# ------------------------------------------------------------------------------------------ report --jobs


@pytest.fixture
def pools(monkeypatch) -> list[int]:
    """The size of every process pool ``report`` starts (the pools still run)."""
    started: list[int] = []
    real = parallel_reader._pool

    def recording(jobs: int):
        started.append(jobs)
        return real(jobs)

    monkeypatch.setattr(parallel_reader, "_pool", recording)
    return started


def test_jobs_far_above_the_cores_starts_no_process_beyond_them(tmp_path, capsys, monkeypatch, pools):
    for rank in range(5):
        write_trace(tmp_path / f"host_rank{rank}.1.pt.trace.json", rank, 5)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)  # one usable core
    code, out, err = report(capsys, tmp_path, "--jobs", "1000", "--format", "json")
    assert code == 0 and pools == []  # one core: read in this process, no pool (was a pool of 5)
    assert "--jobs 1000: reading with 1 process, not 1000: no more than the 1 usable CPU core" in err
    code_1, out_1, err_1 = report(capsys, tmp_path, "--jobs", "1", "--format", "json")
    assert code_1 == 0 and out_1 == out and err_1 == ""  # the same report; no note where nothing was capped

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    code, out_2, err = report(capsys, tmp_path, "--jobs", "1000", "--format", "json")
    assert code == 0 and pools == [2] and out_2 == out
    assert "reading with 2 processes, not 1000: no more than the 2 usable CPU cores" in err
    assert "and the 5 traces to read" in err


# ------------------------------------------------------------------------------- two runs in one folder


def test_traces_of_two_runs_in_one_folder_get_a_cross_rank_view_each(tmp_path, capsys):
    for rank in range(2):  # a run of 2 ranks and a run of 4 ranks, written to one folder
        write_trace(tmp_path / f"a_rank{rank}.1.pt.trace.json", rank, 2, step_us=10_000)
    for rank in range(4):
        write_trace(tmp_path / f"b_rank{rank}.2.pt.trace.json", rank, 4, step_us=20_000 + 1000 * rank)
    code, out, _ = report(capsys, tmp_path, "--format", "json", "--jobs", "1")
    data = json.loads(out)
    assert code == 0 and data["ranks"] is None  # never one table of ranks 0-1 of one run and 2-3 of the other
    assert [(run["world_size"], [row["rank"] for row in run["ranks"]["rows"]]) for run in data["runs"]] == [
        (2, [0, 1]),
        (4, [0, 1, 2, 3]),
    ]
    assert data["runs"][0]["files"] == ["a_rank0.1.pt.trace.json", "a_rank1.1.pt.trace.json"]
    (note,) = [n for n in data["notes"] if "mixes" in n]
    assert "2 runs (world size 2: 2 traces; world size 4: 4 traces)" in note

    code, out, _ = report(capsys, tmp_path, "--jobs", "1")
    assert code == 0 and out.count("Across ranks:") == 2
    first, second = out.split(f"lightning-perf report: {tmp_path} (run 2 of 2: world size 4)")
    assert f"{tmp_path} (run 1 of 2: world size 2)" in first and "mixes the traces of 2 runs" in first
    assert "a_rank1.1" in first and "b_rank" not in first
    assert "b_rank3.2" in second and "a_rank" not in second

    code, out, _ = report(capsys, tmp_path, "--format", "markdown", "--jobs", "1")
    assert code == 0 and out.count("## Across ranks") == 2


def test_one_run_s_folder_has_one_cross_rank_view_and_no_runs_list(tmp_path, capsys):
    for rank in range(3):
        write_trace(tmp_path / f"host_rank{rank}.1.pt.trace.json", rank, 3)
    code, out, _ = report(capsys, tmp_path, "--format", "json", "--jobs", "1")
    data = json.loads(out)
    assert code == 0 and data["runs"] == [] and [r["rank"] for r in data["ranks"]["rows"]] == [0, 1, 2]
    assert not [n for n in data["notes"] if "mixes" in n]


# ------------------------------------------------------------------------------ broken links and FIFOs


def test_links_and_fifos_named_like_traces_are_listed_unreadable_with_why(tmp_path, capsys):
    write_trace(tmp_path / "host_rank0.1.pt.trace.json", 0, 4)
    os.symlink(tmp_path / "gone.pt.trace.json.gz", tmp_path / "host_rank1.1.pt.trace.json.gz")  # dangling
    os.symlink(tmp_path / "host_rank2.1.pt.trace.json.gz", tmp_path / "host_rank2.1.pt.trace.json.gz")  # loop
    os.mkfifo(tmp_path / "host_rank3.1.pt.trace.json")  # never opened: a read would block
    os.symlink(tmp_path / "nowhere.json", tmp_path / "extra.json")  # not torch's name: a note
    code, out, err = report(capsys, tmp_path, "--format", "json", "--jobs", "1")
    assert code == 1  # some files unreadable (was 0: all four skipped without a word)
    data = json.loads(out)
    unreadable = {u["file"]: u for u in data["unreadable"]}
    assert set(unreadable) == {
        "host_rank1.1.pt.trace.json.gz",
        "host_rank2.1.pt.trace.json.gz",
        "host_rank3.1.pt.trace.json",
    }
    assert "a dangling symlink (to " in unreadable["host_rank1.1.pt.trace.json.gz"]["error"]
    assert "a symlink loop" in unreadable["host_rank2.1.pt.trace.json.gz"]["error"]
    assert "a FIFO, not a regular file" in unreadable["host_rank3.1.pt.trace.json"]["error"]
    assert [unreadable[f]["rank"] for f in sorted(unreadable)] == [1, 2, 3]  # from the names
    assert any(n.startswith("skipped extra.json: a dangling symlink") for n in data["notes"])
    for name in unreadable:
        assert f"lightning-perf report: unreadable: {tmp_path / name}: " in err
    assert [t["rank"] for t in data["traces"]] == [0]


def test_a_folder_of_broken_links_only_says_what_each_is(tmp_path, capsys):
    os.symlink(tmp_path / "gone", tmp_path / "host_rank0.1.pt.trace.json.gz")
    code, _, err = report(capsys, tmp_path)
    assert code == 2 and "nothing readable" in err and "a dangling symlink" in err and "Traceback" not in err


# ------------------------------------------------------------------------------ capture on a log root


@pytest.fixture
def log_root(tmp_path) -> Path:
    """lightning_logs with three runs below it, each marked by what its loggers or lightning-perf wrote."""
    root = tmp_path / "lightning_logs"
    for version, name in (
        (0, "events.out.tfevents.1700000000.host.1.0"),
        (1, "metrics.csv"),
        (10, SUMMARY_FILENAME),
    ):
        (root / f"version_{version}").mkdir(parents=True)
        (root / f"version_{version}" / name).write_text("")
    (root / "perf_compare").mkdir()  # compare's TensorBoard run: no fit's folder
    (root / "perf_compare" / "events.out.tfevents.1700000001.host.2.0").write_text("")
    return root


def test_capture_on_a_log_root_refuses_and_names_the_runs_below(log_root, capsys):
    assert cli.main(["capture", str(log_root)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert f"{log_root}: holds no run" in captured.err
    runs = ", ".join(str(log_root / f"version_{v}") for v in (0, 1, 10))  # natural order
    assert f"the run folders below it: {runs} (the last written: " in captured.err
    assert "perf_compare" not in captured.err and "--force" in captured.err
    assert not (log_root / REQUEST_FILENAME).exists()


def test_capture_on_a_run_folder_or_with_force_writes_the_request(log_root, capsys):
    assert cli.main(["capture", str(log_root / "version_1")]) == 0
    assert (log_root / "version_1" / REQUEST_FILENAME).exists()
    assert "record one profiler cycle" in capsys.readouterr().out
    assert cli.main(["capture", str(log_root), "--force"]) == 0
    assert (log_root / REQUEST_FILENAME).exists()


def test_capture_on_an_empty_folder_writes_the_request_and_says_nothing_runs_there_yet(tmp_path, capsys):
    fresh = tmp_path / "fresh"  # a fit's dirpath before its first file: allowed, with a word
    fresh.mkdir()
    assert cli.main(["capture", str(fresh)]) == 0
    out = capsys.readouterr().out
    assert (fresh / REQUEST_FILENAME).exists() and f"{fresh} holds no run's files yet" in out


# ------------------------------------------------------------------------------------ absurd step times


@pytest.mark.parametrize("output", ["text", "markdown", "json"])
def test_step_times_beyond_floats_are_refused_naming_the_run_and_the_figure(tmp_path, capsys, output):
    before = save_summary(tmp_path / "before", [10.0 * (1 + 0.01 * (i % 5)) for i in range(20)])
    after = save_summary(tmp_path / "after", [1e308] * 20)
    code = cli.main(["compare", str(before), str(after), "--no-tensorboard", "--format", output])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""  # was a traceback (json) or "infx slower, nanx-nanx" (text)
    assert captured.err.startswith("lightning-perf compare: error: after: mean step time 1e+308 ms against ")
    assert "a change beyond what a float holds" in captured.err and "Traceback" not in captured.err


def test_huge_but_finite_step_times_compare_in_short_numbers(tmp_path, capsys):
    before = save_summary(tmp_path / "before", [10.0 * (1 + 0.01 * (i % 5)) for i in range(20)])
    after = save_summary(tmp_path / "after", [1e200 * (1 + 0.01 * (i % 5)) for i in range(20)])
    assert cli.main(["compare", str(before), str(after), "--no-tensorboard"]) == 0
    out = capsys.readouterr().out
    assert "(1e+199x slower, 9.9e+198-1.01e+199x)" in out  # not 200 digits before the point
    assert max(len(word) for word in out.split()) < 60
    assert "inf" not in out and "nan" not in out
    assert cli.main(["compare", str(before), str(after), "--no-tensorboard", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["changes"]["after"]["verdict"] == "slower"


@pytest.mark.parametrize(
    ("baseline", "other"),
    [
        ([1e300, -1e300, 1e300], [-1e300, 1e300, -1e300]),  # squares of the differences overflow
        ([0.5, 0.5, 0.5], [1.7e308, 1.7e308, 1.6e308]),  # the ratios overflow
        ([1e-300, 1e-300], [1e300, 1e300]),
    ],
)
def test_round_statistics_never_raise_on_values_at_the_float_limits(baseline, other):
    from lightning_perf.analysis.verdicts.statistics import compare_round_differences, compare_rounds

    for change in (compare_rounds(baseline, other), compare_round_differences(baseline, other)):
        if change is not None:  # a result, perhaps infinite (the comparison refuses it), never nan
            assert all(x == x for x in (change.ratio, change.low, change.high))


def test_batch_means_of_step_times_near_the_float_limit_stay_finite():
    from lightning_perf.analysis.verdicts.mean_intervals import compare_means, mean_interval

    huge = [1e308, 1.7e308] * 5 + [1.7e308, 1e308] * 5  # sums and squares overflow, the mean does not
    low, high = mean_interval(huge)
    assert 1e308 < low < high < 1.7e308  # was OverflowError (squares) or (inf, inf) (sums)
    change = compare_means(huge, [x / 2 for x in huge])
    assert change is not None and change.ratio == pytest.approx(0.5)


# ---------------------------------------------------------------------------- comparison JSON read back


@pytest.fixture
def comparison_file(tmp_path, capsys) -> Path:
    before = save_summary(tmp_path / "before", [10.0 * (1 + 0.01 * (i % 5)) for i in range(20)])
    after = save_summary(tmp_path / "after", [8.0 * (1 + 0.01 * (i % 5)) for i in range(20)])
    assert cli.main(["compare", str(before), str(after), "--no-tensorboard", "--format", "json"]) == 0
    path = tmp_path / "comparison.json"
    path.write_text(capsys.readouterr().out)
    return path


def _without(path: Path, edit) -> dict:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    return data


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d.pop("verdict"), "'verdict'"),
        (lambda d: d["metrics"][0].pop("ratios"), "'metrics[0].ratios'"),
        (lambda d: d["changes"]["after"].pop("time_ratio_low"), "'changes.after.time_ratio_low'"),
        (lambda d: d["metrics"][0]["changes"][1].pop("kind"), "'metrics[0].changes[1].kind'"),
    ],
)
def test_a_comparison_json_missing_a_field_names_it_and_the_file(comparison_file, edit, field):
    assert from_json(json.loads(comparison_file.read_text())).verdict  # whole, it reads back
    data = _without(comparison_file, edit)
    with pytest.raises(ValueError) as raised:  # was a bare KeyError naming only the key
        from_json(data, source=str(comparison_file))
    assert str(raised.value) == f"{comparison_file}: malformed comparison: missing field {field}"
    from lightning_perf.analysis.verdicts.comparison_render import ComparisonFileError, load_comparison

    with pytest.raises(ComparisonFileError, match=re.escape(f"missing field {field}")):
        load_comparison(str(comparison_file))


def test_a_comparison_json_with_a_wrong_type_or_kind_names_the_field(comparison_file):
    data = _without(comparison_file, lambda d: d["changes"]["after"].update(kind="speed"))
    with pytest.raises(
        ValueError, match=r"changes\.after\.kind: 'speed' is none of time, rate, ratio, points"
    ):
        from_json(data, source=str(comparison_file))
    data = _without(comparison_file, lambda d: d.update(metrics={"a": 1}))
    with pytest.raises(
        ValueError, match=f"{comparison_file}: malformed comparison: metrics: expected a list"
    ):
        from_json(data, source=str(comparison_file))


def test_two_runs_of_one_world_size_in_one_folder_are_told_apart_by_their_processes(tmp_path, capsys):
    # run a: ranks 0-1 (processes 100, 101), two cycles each; run b an hour later: ranks 0-1 (processes 200, 201)
    for rank in range(2):
        for cycle, start in enumerate((1_000_000, 2_000_000)):
            write_trace(
                tmp_path / f"a_rank{rank}.{cycle}.pt.trace.json", rank, 2, pid=100 + rank, start_us=start
            )
        write_trace(
            tmp_path / f"b_rank{rank}.9.pt.trace.json", rank, 2, pid=200 + rank, start_us=3_600_000_000
        )
    code, out, _ = report(capsys, tmp_path, "--format", "json", "--jobs", "1")
    data = json.loads(out)
    assert code == 0 and data["ranks"] is None
    files = [sorted(run["files"]) for run in data["runs"]]
    assert files == [
        [
            "a_rank0.0.pt.trace.json",
            "a_rank0.1.pt.trace.json",
            "a_rank1.0.pt.trace.json",
            "a_rank1.1.pt.trace.json",
        ],
        ["b_rank0.9.pt.trace.json", "b_rank1.9.pt.trace.json"],
    ]
    (note,) = [n for n in data["notes"] if "mixes" in n]
    assert "2 runs (world size 2: 4 traces; world size 2: 2 traces)" in note
