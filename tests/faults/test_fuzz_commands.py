"""Property-based fuzzing (Hypothesis) of the files the commands read: traces for ``report``, summaries for
``compare``. Whatever the file holds, a command ends with an exit code (0, 1 or 2) and never a traceback; what
it prints is strict JSON (``--format json``) and never shows ``inf`` or ``nan``.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_perf import cli
from lightning_perf.analysis.summary import SUMMARY_FILENAME, Distribution, RunSummary, TimingSummary

# derandomize: the same 60 files on every run, so that CI cannot flake (a new seed is a local exploration)
FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

hostile_numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([-1, 0, 1e308, -1e308, "BIG"]),
)
hostile_values = st.one_of(hostile_numbers, st.none(), st.text(max_size=5), st.booleans(), st.just([[[[1]]]]))
event_names = st.sampled_from(["ProfilerStep#3", "ProfilerStep#4", "aten::mm", "cudaLaunchKernel", "gemm"])
categories = st.sampled_from(["cpu_op", "user_annotation", "kernel", "cuda_runtime", "gpu_memcpy", 5])


@st.composite
def events(draw):
    event = {
        "ph": draw(st.sampled_from(["X", "X", "X", "M", "i", "f"])),
        "name": draw(event_names),
        "cat": draw(categories),
        "pid": draw(st.sampled_from([1, 0, "x"])),
        "tid": draw(st.sampled_from([1, 7])),
        "ts": draw(st.one_of(st.integers(0, 10**4), hostile_values)),
        "dur": draw(st.one_of(st.integers(0, 10**3), hostile_values)),
    }
    for key in draw(st.lists(st.sampled_from(["ts", "dur", "name", "ph"]), max_size=2)):
        event.pop(key, None)
    if draw(st.booleans()):
        event["args"] = {"correlation": draw(hostile_values), "External id": draw(hostile_values)}
    return event


def _json_text(value) -> str:
    # json.dumps writes NaN/Infinity literals (as torch could); a 5000-digit integer is written by hand
    return json.dumps(value, default=str).replace('"BIG"', "1" * 5000)


@st.composite
def trace_files(draw):
    text = _json_text({"traceEvents": draw(st.lists(events(), max_size=25)), "schemaVersion": 1})
    damage = draw(st.sampled_from(["none", "none", "cut", "deep", "garbage"]))
    if damage == "cut":
        text = text[: draw(st.integers(0, len(text)))]
    elif damage == "deep":
        text = '{"traceEvents": [' + "[" * 100_000 + "]" * 100_000 + "]}"
    elif damage == "garbage":
        text = draw(st.text(max_size=50))
    return text, draw(st.booleans())


def strict_json(text: str):
    def reject(name):
        raise AssertionError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=reject)


@pytest.mark.once  # `report` reads trace files only: the same on every Lightning
@FUZZ
@given(
    files=st.lists(trace_files(), min_size=1, max_size=3), fmt=st.sampled_from(["text", "json", "markdown"])
)
def test_report_on_hostile_traces(capsys, files, fmt):
    with tempfile.TemporaryDirectory() as run_dir:
        for index, (text, gz) in enumerate(files):
            path = os.path.join(run_dir, f"host_rank0.{index}.pt.trace.json" + (".gz" if gz else ""))
            with gzip.open(path, "wt") if gz else open(path, "w") as fh:
                fh.write(text)
        code = cli.main(["report", run_dir, "--format", fmt])
    out, err = capsys.readouterr()
    assert code in (0, 1, 2) and "Traceback" not in err
    if code == 2:
        assert out == "" and err.startswith("lightning-perf report: error:")
        return
    if fmt == "json":
        strict_json(out)
    words = out.lower().replace("info", "")
    assert "inf" not in words and "nan" not in words


def _summary(steps: int = 20) -> dict:
    timing = TimingSummary(steps=steps, samples=steps * 4, step_time_ms=Distribution.of([10.0, 12.0, 11.0]))
    timing.data_wait_pct = 5.0
    return RunSummary(run_name="run", timing=timing).to_dict()


def _set_path(data: dict, path: list[str], value) -> None:
    for key in path[:-1]:
        data = data.setdefault(key, {}) if isinstance(data.get(key, {}), dict) else {}
    data[path[-1]] = value


def _numbers(value):
    if isinstance(value, dict):
        for item in value.values():
            yield from _numbers(item)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield value


field_paths = st.sampled_from([
    ["timing", "steps"], ["timing", "step_time_ms", "median"], ["timing", "step_time_ms", "mean"],
    ["timing", "data_wait_pct"], ["timing", "samples_per_sec"], ["timing"], ["utilization", "cpu"],
    ["settings", "num_workers"], ["schema_version"], ["findings"], ["traces"], ["probes", "x"],
])  # fmt: skip


@FUZZ
@given(
    edits=st.lists(st.tuples(field_paths, hostile_values), max_size=3),
    damage=st.sampled_from(["none", "none", "cut", "deep", "huge"]),
    fmt=st.sampled_from(["text", "json", "markdown"]),
)
def test_compare_on_hostile_summaries(capsys, edits, damage, fmt):
    data = _summary()
    for path, value in edits:
        _set_path(data, path, value)
    text = _json_text(data)
    if damage == "cut":
        text = text[: len(text) // 2]
    elif damage == "deep":
        text = "[" * 50_000 + "]" * 50_000
    elif damage == "huge":
        text = '{"schema": "' + "x" * (17 << 20) + '"}'
    with tempfile.TemporaryDirectory() as root:
        for name, content in (("a", _json_text(_summary())), ("b", text)):
            os.makedirs(os.path.join(root, name))
            with open(os.path.join(root, name, SUMMARY_FILENAME), "w") as fh:
                fh.write(content)
        code = cli.main(["compare", os.path.join(root, "a"), os.path.join(root, "b"), "--no-tensorboard",
                         "--format", fmt])  # fmt: skip
    out, err = capsys.readouterr()
    assert code in (0, 1, 2) and "Traceback" not in err
    hostile = any(
        isinstance(v, float) and (not math.isfinite(v) or v < 0) for v in _numbers(data.get("timing"))
    )
    if hostile and damage == "none":
        assert code == 2 and "corrupt run summary" in err  # a NaN, infinite or negative time is corrupt
    if code == 0 and fmt == "json":
        strict_json(out)
    if code == 0:
        assert "nan" not in out.lower() and "inf " not in out.lower()
