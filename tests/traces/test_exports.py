"""Flame-graph, Speedscope and memory-timeline exports, from real torch.profiler runs."""

from __future__ import annotations

import json
import logging
import os
import re
from types import SimpleNamespace

import pytest
import torch

from lightning_perf.traces import exports
from lightning_perf.traces.read.reader import TraceError, iter_events
from tests.helpers import assert_valid_speedscope, profile_tiny_loop

COLLAPSED_LINE = re.compile(r"^[^;\n]+(;[^;\n]+)* \d+$")


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One run with stacks, shapes and memory on, exporting everything at trace-ready time."""
    out_dir = str(tmp_path_factory.mktemp("exports"))
    result: dict = {}

    def on_ready(prof, base):
        result["trace"] = base + ".pt.trace.json.gz"
        result["stacks"] = exports.export_collapsed_stacks(prof, base)
        result["memory_ok"] = exports.export_memory_timeline(prof, base + ".memory.html", "cpu")
        result["memory"] = base + ".memory.html"
        result["base"] = base

    profile_tiny_loop(
        out_dir,
        on_ready=on_ready,
        with_stack=True,
        record_shapes=True,
        profile_memory=True,
        experimental_config=exports.stacks_experimental_config(),
    )
    return result


def test_stacks_experimental_config_is_verbose():
    config = exports.stacks_experimental_config()
    assert isinstance(config, torch._C._profiler._ExperimentalConfig)


def test_collapsed_stacks_of_a_real_run(full_run):
    assert full_run["stacks"] == [full_run["base"] + ".cpu.stacks.txt"]  # no CUDA on a CPU run
    with open(full_run["stacks"][0], encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    assert lines
    for line in lines:
        assert COLLAPSED_LINE.match(line), line
        assert int(line.rsplit(" ", 1)[1]) > 0
        assert " at 0x" not in line  # object addresses are dropped so frames merge
    leaves = {line.rsplit(" ", 1)[0].split(";")[-1] for line in lines}
    assert "aten::addmm" in leaves
    # Python frames above the operators: the model's forward is somewhere in the stacks
    assert any(";" in line and "torch/nn/modules/module.py" in line for line in lines)


def test_stacks_need_the_experimental_config(tmp_path, caplog):
    """PyTorch issue 100253, checked: with_stack=True alone records no stacks, and torch's own export_stacks
    writes an empty file; with the verbose config it writes them."""
    seen: dict = {}

    def on_ready(prof, base):
        prof.export_stacks(base + ".torch.txt", "self_cpu_time_total")
        with caplog.at_level(logging.WARNING, logger="lightning_perf.traces.exports"):
            seen["ours"] = exports.export_collapsed_stacks(prof, base)
        seen["base"] = base

    os.makedirs(tmp_path / "plain")
    profile_tiny_loop(str(tmp_path / "plain"), on_ready=on_ready, with_stack=True)
    assert os.path.getsize(seen["base"] + ".torch.txt") == 0
    assert seen["ours"] == []
    assert not os.path.exists(seen["base"] + ".cpu.stacks.txt")
    assert "stacks_experimental_config" in caplog.text

    config = exports.stacks_experimental_config()
    os.makedirs(tmp_path / "verbose")
    profile_tiny_loop(
        str(tmp_path / "verbose"), on_ready=on_ready, with_stack=True, experimental_config=config
    )
    assert os.path.getsize(seen["base"] + ".torch.txt") > 0
    assert seen["ours"] == [seen["base"] + ".cpu.stacks.txt"]


def test_no_stacks_without_with_stack(tmp_path):
    seen: dict = {}
    profile_tiny_loop(
        str(tmp_path),
        on_ready=lambda prof, base: seen.update(paths=exports.export_collapsed_stacks(prof, base)),
    )
    assert seen["paths"] == []
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".stacks.txt")]


def _event(name: str, stack: list[str], cpu_us: float, device_us: float = 0.0, device: str = "CPU"):
    return SimpleNamespace(
        name=name,
        stack=stack,
        self_cpu_time_total=cpu_us,
        self_device_time_total=device_us,
        device_type=SimpleNamespace(name=device),
        is_async=False,
    )


def test_collapsed_stacks_keep_the_format_and_write_device_time(tmp_path):
    # innermost frame first, as torch stores FunctionEvent.stack
    stack = ["model.py(3): step;\nbad", "train.py(10): <module>"]
    prof = SimpleNamespace(
        with_stack=True,
        use_device="cuda",
        events=lambda: [
            _event("aten::mm", stack, 30.4, device_us=120.6),
            _event("aten::mm", stack, 10.0, device_us=5.0),  # same stack: summed
            _event("aten::add", ["train.py(10): <module>"], 0.2),  # rounds to 0 us: left out
            _event("", [], 7.0),  # empty name
            _event("sgemm_kernel", [], 0.0, device_us=125.6, device="CUDA"),  # counted via aten::mm already
        ],
    )
    paths = exports.export_collapsed_stacks(prof, str(tmp_path / "run"))
    assert paths == [str(tmp_path / "run.cpu.stacks.txt"), str(tmp_path / "run.cuda.stacks.txt")]
    cpu = (tmp_path / "run.cpu.stacks.txt").read_text().splitlines()
    assert cpu == ["? 7", "train.py(10): <module>;model.py(3): step__bad;aten::mm 40"]
    cuda = (tmp_path / "run.cuda.stacks.txt").read_text().splitlines()
    assert cuda == ["train.py(10): <module>;model.py(3): step__bad;aten::mm 126"]
    assert all(COLLAPSED_LINE.match(line) for line in cpu + cuda)


def test_memory_timeline_of_a_real_run(full_run):
    assert full_run["memory_ok"] is True
    with open(full_run["memory"], encoding="utf-8") as fh:
        html = fh.read()
    assert "<html" in html and "data:image/png;base64" in html


def test_memory_timeline_needs_the_three_flags(tmp_path, caplog):
    seen: dict = {}

    def on_ready(prof, base):
        with caplog.at_level(logging.WARNING, logger="lightning_perf.traces.exports"):
            seen["ok"] = exports.export_memory_timeline(prof, base + ".memory.html", "cpu")
        seen["path"] = base + ".memory.html"

    profile_tiny_loop(
        str(tmp_path), on_ready=on_ready, profile_memory=True, record_shapes=True
    )  # no with_stack
    assert seen["ok"] is False
    assert not os.path.exists(seen["path"])
    assert "with_stack=True" in caplog.text


def test_memory_timeline_never_raises_for_a_failing_profiler(tmp_path, caplog):
    def broken(path, device):
        with open(path, "w") as fh:
            fh.write("partial")
        raise RuntimeError("no kineto results")

    prof = SimpleNamespace(
        profile_memory=True, record_shapes=True, with_stack=True, export_memory_timeline=broken
    )
    out = tmp_path / "m.html"
    with caplog.at_level(logging.WARNING, logger="lightning_perf.traces.exports"):
        assert exports.export_memory_timeline(prof, out, "cuda:0") is False
    assert not out.exists()
    assert "no kineto results" in caplog.text
    with pytest.raises(ValueError, match="out_path"):
        exports.export_memory_timeline(prof, tmp_path / "m.png", "cpu")


def test_speedscope_of_a_real_trace(full_run, tmp_path):
    out = tmp_path / "trace.speedscope.json"
    exports.trace_to_speedscope(full_run["trace"], out)
    doc = json.loads(out.read_text())
    complete = [e for e in iter_events(full_run["trace"]) if e.get("ph") == "X"]
    assert assert_valid_speedscope(doc) == len(complete)  # every complete event kept
    names = {f["name"] for f in doc["shared"]["frames"]}
    assert "aten::addmm" in names and "ProfilerStep#2" in names
    assert not os.path.exists(f"{out}.partial")


def test_speedscope_clips_events_that_overlap_without_nesting(tmp_path):
    def x(name, ts, dur, tid=1):
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": 1000 + ts, "dur": dur}

    trace = {
        "traceEvents": [
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}},
            x("A", 0, 100),
            x("B", 50, 100),  # starts inside A, ends after it: clipped to end at 100
            x("C", 60, 10),  # inside B
            x("D", 100, 20),  # after A
            x("E", 0, 5, tid=2),
            x("F", 10, -3, tid=2),  # corrupt negative duration: left out
        ]
    }
    src = tmp_path / "t.pt.trace.json"
    src.write_text(json.dumps(trace))
    out = tmp_path / "t.speedscope.json"
    exports.trace_to_speedscope(src, out)
    doc = json.loads(out.read_text())
    assert assert_valid_speedscope(doc) == 5
    frames = [f["name"] for f in doc["shared"]["frames"]]
    main, other = doc["profiles"]
    assert "main" in main["name"]
    trail = [(e["type"], frames[e["frame"]], e["at"]) for e in main["events"]]
    assert trail == [
        ("O", "A", 0.0), ("O", "B", 50.0), ("O", "C", 60.0), ("C", "C", 70.0), ("C", "B", 100.0),
        ("C", "A", 100.0), ("O", "D", 100.0), ("C", "D", 120.0),
    ]  # fmt: skip
    assert (main["startValue"], main["endValue"]) == (0.0, 120.0)
    assert [(e["type"], e["at"]) for e in other["events"]] == [("O", 0.0), ("C", 5.0)]


def test_speedscope_of_a_bad_trace_raises_trace_error(tmp_path):
    src = tmp_path / "bad.pt.trace.json"
    src.write_text('{"traceEvents": [{"ph": "X", "name": "A", "ts": 1, "dur": 2}')
    with pytest.raises(TraceError, match="bad.pt.trace.json"):
        exports.trace_to_speedscope(src, tmp_path / "out.json")
    assert not (tmp_path / "out.json").exists()
