"""The pure comparison: ratio maths, settings/environment diffs, n/a handling, verdict, rendering, JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lightning_perf.analysis.summary import (
    CpuUtilization,
    Distribution,
    GpuUtilization,
    MachineState,
    RunSummary,
    Settings,
    TimingSummary,
    UtilizationSummary,
)
from lightning_perf.analysis.verdicts.comparison import ENVIRONMENT_KEYS, Comparison, check_summary, compare
from lightning_perf.analysis.verdicts.comparison_render import (
    format_change,
    from_json,
    render_markdown,
    render_text,
    to_json,
)


def make_summary(
    step_ms: float | None = 100.0,
    data_wait_pct: float | None = 45.0,
    num_workers: int = 0,
    gpu_util_pct: float | None = None,
    steps: int = 50,
    **settings: object,
) -> RunSummary:
    settings["num_workers"] = num_workers
    batch = 32
    step_time = None if step_ms is None else Distribution.of([step_ms * f for f in (0.9, 1.0, 1.0, 1.1, 1.5)])
    median = step_time.median if step_time else None
    return RunSummary(
        timing=TimingSummary(
            steps=steps,
            samples=steps * batch,
            step_time_ms=step_time,
            data_wait_pct=data_wait_pct,
            samples_per_sec=batch * 1000.0 / median if median else None,
        ),
        utilization=UtilizationSummary(
            gpu=GpuUtilization(util_pct=gpu_util_pct) if gpu_util_pct is not None else None,
            cpu=CpuUtilization(process_cpu_pct=98.0),
        ),
        settings=Settings(**{"batch_size": batch, "host": "node1", "torch_version": "2.14.1", **settings}),
    )


def before_after(**after: object) -> Comparison:
    before = make_summary(step_ms=100.0, data_wait_pct=45.0, num_workers=0)
    after_kwargs: dict = {"step_ms": 60.0, "data_wait_pct": 3.1, "num_workers": 4, **after}
    return compare([before, make_summary(**after_kwargs)], ["baseline", "workers4"])


def test_format_change_ratio_maths():
    assert (
        format_change("step time", 100.0, 60.0, "ms", "lower")
        == "step time 100.0 ms -> 60.0 ms, 1.67x faster"
    )
    assert (
        format_change("step time", 60.0, 100.0, "ms", "lower")
        == "step time 60.0 ms -> 100.0 ms, 1.67x slower"
    )
    # throughput: higher is better, so more samples/s is faster
    assert format_change("throughput", 300.0, 600.0, "samples/s", "higher").endswith("2.00x faster")
    assert format_change("throughput", 600.0, 300.0, "samples/s", "higher").endswith("2.00x slower")
    # shares change in percentage points, judged by the metric's direction
    assert format_change("data wait", 45.0, 3.1, "%", "lower") == "data wait 45.0% -> 3.1%, -41.9 pts, better"
    assert (
        format_change("GPU util", 30.0, 50.0, "%", "higher") == "GPU util 30.0% -> 50.0%, +20.0 pts, better"
    )
    assert format_change("GPU util", 50.0, 30.0, "%", "higher").endswith("-20.0 pts, worse")
    # neutral metrics are described, not judged
    assert (
        format_change("peak GPU memory", 2.0, 3.0, "GB", None)
        == "peak GPU memory 2.00 GB -> 3.00 GB, 1.50x higher"
    )
    assert format_change("step time", 100.0, 100.0, "ms", "lower").endswith("about the same")


def test_format_change_absent_values_are_na_and_unjudged():
    assert format_change("step time", None, 60.0, "ms", "lower") == "step time n/a -> 60.0 ms"
    assert format_change("data wait", 45.0, None, "%", "lower") == "data wait 45.0% -> n/a"


def test_metric_values_and_ratios_against_baseline():
    c = before_after()
    step = c.metric("step_time_mean_ms")  # the headline; these summaries' steps average 1.1x the median
    assert step is not None
    assert step.values == [pytest.approx(110.0), pytest.approx(66.0)]
    assert step.ratios == [pytest.approx(1.0), pytest.approx(0.6)]
    assert step.better == "lower"
    throughput = c.metric("samples_per_sec")
    assert throughput is not None and throughput.better == "higher"
    assert throughput.ratios[1] == pytest.approx(100.0 / 60.0)
    assert c.slower_than_baseline == {}
    text = render_text(c)
    # without per-step samples there is no interval: sizes only, never judged faster/better
    assert "66.0 ms (1.67x lower, no interval)" in text
    assert "3.1% (-41.9 pts, no interval)" in text
    assert "better" not in text and "worse" not in text


def test_slower_run_is_reported_in_percent():
    c = compare([make_summary(step_ms=60.0), make_summary(step_ms=100.0)], ["fast", "slow"])
    assert c.slower_than_baseline == {"slow": pytest.approx(100.0 / 60.0 * 100.0 - 100.0)}
    assert "110.0 ms (1.67x higher, no interval)" in render_text(c)


def test_settings_diff_lists_only_differing_keys():
    c = before_after(cudnn_benchmark=True)
    # batch_size, host and torch_version are equal; cudnn_benchmark is None in the baseline
    assert c.settings_diff == {"num_workers": [0, 4], "cudnn_benchmark": [None, True]}
    assert c.environment_diff == {}
    assert not any(w.startswith("warning: runs come from different environments") for w in c.warnings)
    text = render_text(c)
    assert "num_workers" in text and "cudnn_benchmark" in text and "batch_size" not in text


def test_no_settings_differ_is_said():
    c = compare([make_summary(), make_summary(step_ms=90.0)], ["a", "b"])
    assert c.settings_diff == {}
    assert "no settings differ" in render_text(c)
    assert "No settings differ" in render_markdown(c)


def test_environment_diff_is_flagged_in_every_format():
    c = before_after(host="node2", torch_version="2.15.0")
    assert c.environment_diff == {"host": ["node1", "node2"], "torch_version": ["2.14.1", "2.15.0"]}
    # machine and software differences are not presented as setting changes
    assert not set(c.settings_diff) & set(ENVIRONMENT_KEYS)
    warning = next(w for w in c.warnings if "different environments" in w)
    assert "host: node1 / node2" in warning and "torch_version: 2.14.1 / 2.15.0" in warning
    assert warning in render_text(c)
    assert warning in render_markdown(c)
    assert warning in to_json(c)["warnings"]


def test_absent_values_are_na_never_zero():
    c = compare(
        [make_summary(data_wait_pct=45.0, gpu_util_pct=30.0), make_summary(data_wait_pct=None)], ["a", "b"]
    )
    wait = c.metric("data_wait_pct")
    gpu = c.metric("gpu_util_pct")
    assert wait is not None and wait.values[1] is None and wait.ratios[1] is None
    assert gpu is not None and gpu.values == [30.0, None]
    for rendered in (render_text(c), render_markdown(c)):
        wait_line = next(line for line in rendered.splitlines() if "data wait" in line and "45.0%" in line)
        assert "n/a" in wait_line and "0.0%" not in wait_line
        gpu_line = next(line for line in rendered.splitlines() if "GPU util" in line)
        assert "30.0%" in gpu_line and "n/a" in gpu_line
    assert to_json(c)["metrics"][3]["values"] == [45.0, None]


def test_gpu_rows_only_where_present():
    cpu_only = before_after()
    keys = [row.key for row in cpu_only.metrics]
    assert "gpu_util_pct" not in keys and "kernel_busy_pct" not in keys and "peak_gpu_mem_gb" not in keys
    assert {"step_time_mean_ms", "step_time_median_ms", "step_time_p90_ms", "data_wait_pct"} <= set(keys)
    assert "process_cpu_pct" in keys
    with_gpu = before_after(gpu_util_pct=50.0)
    gpu = with_gpu.metric("gpu_util_pct")
    assert gpu is not None and gpu.values == [None, 50.0]


def test_verdict_two_runs():
    faster = before_after()
    assert (
        faster.verdict
        == "workers4 is 1.67x faster than baseline (mean step time; no interval: no per-step samples); "
        "throughput 320.0 samples/s -> 533.3 samples/s; data wait 45.0% -> 3.1%"
    )
    assert f"verdict: {faster.verdict}" in render_text(faster)
    with_gpu = compare(
        [make_summary(gpu_util_pct=30.0), make_summary(step_ms=60.0, data_wait_pct=3.1, gpu_util_pct=50.0)],
        ["before", "after"],
    )
    assert with_gpu.verdict.endswith("data wait 45.0% -> 3.1%; GPU util 30.0% -> 50.0%")
    slower = compare([make_summary(step_ms=60.0), make_summary(step_ms=100.0)], ["fast", "slow"])
    assert slower.verdict.startswith("slow is 1.67x slower than fast (mean step time;")
    same = compare([make_summary(step_ms=100.0), make_summary(step_ms=100.1)], ["a", "b"])
    assert same.verdict.startswith("b is about as fast as a")


def test_verdict_several_runs_and_missing_times():
    runs = [make_summary(step_ms=100.0), make_summary(step_ms=80.0), make_summary(step_ms=50.0)]
    c = compare(runs, ["w0", "w2", "w4"])
    assert c.verdict.startswith("fastest of 3 runs: w4 is 2.00x faster than w0 (mean step time;")
    worse = compare(
        [make_summary(step_ms=50.0), make_summary(step_ms=80.0), make_summary(step_ms=100.0)], "abc"
    )
    assert worse.verdict.startswith("no run is faster than a; the fastest: b is 1.60x slower than a")
    no_base = compare([make_summary(step_ms=None), make_summary()], ["a", "b"])
    assert no_base.verdict == "no verdict: baseline a has no mean step time"


def test_baseline_selection():
    runs = [make_summary(step_ms=100.0, num_workers=0), make_summary(step_ms=50.0, num_workers=4)]
    c = compare(runs, ["w0", "w4"], baseline=1)
    assert c.baseline == "w4" and c.baseline_index == 1
    step = c.metric("step_time_mean_ms")
    assert step is not None and step.ratios == [pytest.approx(2.0), pytest.approx(1.0)]
    assert c.slower_than_baseline == {"w0": pytest.approx(100.0)}
    assert c.verdict.startswith("w0 is 2.00x slower than w4")
    assert "w4 (baseline)" in render_text(c) and "110.0 ms (2.00x higher, no interval)" in render_text(c)
    with pytest.raises(ValueError, match="baseline index 2"):
        compare(runs, ["w0", "w4"], baseline=2)


def test_compare_rejects_bad_input():
    with pytest.raises(ValueError, match="2 summaries but 1 names"):
        compare([make_summary(), make_summary()], ["a"])
    with pytest.raises(ValueError, match="at least two runs"):
        compare([make_summary()], ["a"])
    with pytest.raises(ValueError, match="unique"):
        compare([make_summary(), make_summary()], ["a", "a"])


def test_json_round_trip_and_stable_keys():
    c = before_after(host="node2", gpu_util_pct=50.0)
    data = json.loads(json.dumps(to_json(c), allow_nan=False))
    assert list(data) == [
        "schema",
        "schema_version",
        "run_names",
        "baseline",
        "settings_diff",
        "environment_diff",
        "metrics",
        "verdict",
        "slower_than_baseline",
        "warnings",
        "changes",
        "method",
        "rounds",
        "variants_differ",
        "hparams_diff",
    ]
    assert set(data["metrics"][0]) == {
        "key",
        "label",
        "unit",
        "better",
        "values",
        "ratios",
        "changes",
        "intervals",
    }
    assert from_json(data) == c
    with pytest.raises(ValueError, match="not a lightning-perf comparison"):
        from_json({"schema": "other"})


def test_partial_and_unfinished_runs_are_warned():
    partial = make_summary(step_ms=None, data_wait_pct=None, steps=0)
    c = compare([make_summary(), partial], ["full", "partial"])
    assert "warning: partial is a partial summary: no training steps were timed" in c.warnings
    unfinished = make_summary()
    unfinished.status = "interrupted"
    c = compare([make_summary(), unfinished], ["a", "b"])
    assert any("b has status 'interrupted'" in w for w in c.warnings)


def test_a_run_on_a_throttled_gpu_is_warned_with_its_clocks():
    from lightning_perf.analysis.summary import MachineState

    throttled = make_summary()
    throttled.machine = MachineState(
        gpu_sm_clock_mhz=1200.0,
        gpu_sm_clock_max_mhz=1980.0,
        gpu_slowdown_pct={"thermal limit (software)": 60.0},
    )
    c = compare([make_summary(), throttled], ["cool", "hot"])
    (warning,) = [w for w in c.warnings if w.startswith("warning: hot")]
    assert warning.startswith("warning: hot was measured with its GPU's clocks held down:")
    assert "thermal limit (software) in 60.0%" in warning and "1200 of 1980 MHz" in warning


def test_check_summary_rejects_malformed_fields():
    check_summary(make_summary())
    broken = make_summary()
    broken.timing = None  # type: ignore[assignment]
    with pytest.raises(ValueError, match="timing"):
        check_summary(broken)
    text_value = make_summary()
    text_value.timing.data_wait_pct = "45%"  # type: ignore[assignment]
    with pytest.raises(ValueError, match="data_wait_pct is '45%'"):
        check_summary(text_value)


def test_compare_module_is_pure():
    code = (
        "import sys, lightning_perf.analysis.verdicts.comparison\n"
        "heavy = {'lightning', 'pytorch_lightning', 'tensorboard', 'matplotlib', 'torch'}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize(
    ("machine", "said"),
    [
        # others held the cores the run needed (the training thread waited for one): a busy machine, no GPU
        (MachineState(cpu_count=2, other_cores=1.8, train_thread_runqueue_pct=12.0), "on a busy machine"),
        (MachineState(cpu_count=2, other_cores=1.0), "on a busy machine"),
        (
            MachineState(cpu_count=2, other_cores=0.0, gpu_slowdown_pct={"hw_power_brake": 50.0}),
            "clocks held down",
        ),
    ],
)
def test_a_noisy_run_is_named_for_what_disturbed_it(machine, said):
    before, after = make_summary(), make_summary(step_ms=60.0)
    before.machine = machine
    text = render_text(compare([before, after], ["before", "after"]))
    (line,) = [line for line in text.splitlines() if line.startswith("warning: before was measured")]
    assert said in line
    assert "GPU" not in line or said == "clocks held down"  # a CPU-only machine's cores are no GPU's clocks
