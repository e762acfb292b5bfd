"""Diagnosis rules on hand-built run summaries, at and around every threshold, and their rendering."""

from __future__ import annotations

import json

import pytest

from lightning_perf.analysis import diagnosis
from lightning_perf.analysis.diagnosis import diagnose, input_bound_verdict
from lightning_perf.analysis.findings_render import (
    CONSOLE_WIDTH,
    render_console,
    render_markdown,
    render_probe_markdown,
)
from lightning_perf.analysis.probe_results import NumWorkersProbe, Probes
from lightning_perf.analysis.rules.thresholds import SEVERITY_ORDER
from lightning_perf.analysis.summary import (
    CpuUtilization,
    Distribution,
    GpuUtilization,
    RankStats,
    RunSummary,
    Settings,
    TimingSummary,
    UtilizationSummary,
)


def dist(median: float) -> Distribution:
    return Distribution(count=10, mean=median, median=median, p90=median, min=median, max=median)


def make(
    wait_pct: float | None = None,
    *,
    step_ms: float | None = None,
    wait_ms: float | None = None,
    compute_ms: float | None = None,
    timing: dict | None = None,
    gpu: dict | None = None,
    cpu: dict | None = None,
    ranks: list[RankStats] | None = None,
    probes: Probes | None = None,
    **settings,
) -> RunSummary:
    return RunSummary(
        run_name="run-a",
        timing=TimingSummary(
            steps=100,
            data_wait_pct=wait_pct,
            step_time_ms=None if step_ms is None else dist(step_ms),
            data_wait_ms=None if wait_ms is None else dist(wait_ms),
            compute_ms=None if compute_ms is None else dist(compute_ms),
            **(timing or {}),
        ),
        utilization=UtilizationSummary(
            gpu=None if gpu is None else GpuUtilization(**gpu),
            cpu=None if cpu is None else CpuUtilization(**cpu),
        ),
        settings=Settings(**settings),
        ranks=ranks or [],
        probes=probes or Probes(),
    )


def by_id(findings, finding_id):
    matches = [f for f in findings if f.id == finding_id]
    assert len(matches) <= 1, f"more than one {finding_id} finding"
    return matches[0] if matches else None


# --- input-bound verdict ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pct", "verdict", "severity"),
    [
        (0.0, "not input-bound", "info"),
        (4.99, "not input-bound", "info"),
        (5.0, "moderately input-bound", "medium"),
        (19.99, "moderately input-bound", "medium"),
        (20.0, "highly input-bound", "high"),
        (87.5, "highly input-bound", "high"),
    ],
)
def test_input_bound_grades_at_tensorflow_thresholds(pct, verdict, severity):
    assert input_bound_verdict(pct) == verdict
    findings = diagnose(make(pct, num_workers=0))
    bound = [f for f in findings if f.id == "input_bound"]
    assert len(bound) == 1
    assert verdict in bound[0].title
    assert bound[0].severity == severity
    assert f"{pct:.1f}%" in bound[0].evidence


@pytest.mark.parametrize("pct", [None, float("nan"), float("inf")])
def test_no_verdict_without_a_measured_wait_share(pct):
    assert input_bound_verdict(pct) is None
    assert by_id(diagnose(make(pct, num_workers=0)), "input_bound") is None


def test_empty_summary_gives_no_findings():
    assert diagnose(RunSummary()) == []


def test_diagnose_rejects_other_types():
    with pytest.raises(ValueError, match="summary"):
        diagnose({"timing": {}})


def test_evidence_states_the_means_the_share_is_made_of():
    finding = by_id(diagnose(make(43.2, step_ms=12.1, wait_ms=5.3)), "input_bound")
    assert finding.evidence == (
        "DataLoader wait is 43.2% of step time (over all 100 timed steps: mean step 12.1 ms, mean wait 5.3 ms)."
    )


def test_not_input_bound_changes_nothing():
    finding = by_id(diagnose(make(3.0, num_workers=0, step_ms=10, wait_ms=0.3)), "input_bound")
    assert finding.settings_change == {}


# --- num_workers: measured by the probe, else estimated ------------------------------------------------


def test_probe_suggestion_is_used():
    probe = NumWorkersProbe(suggested=6, reason="num_workers=6 delivers 120.0 batches/s")
    finding = by_id(diagnose(make(30.0, num_workers=1, probes=Probes(num_workers=probe))), "input_bound")
    assert finding.settings_change == {"num_workers": 6}
    assert "probe" in finding.recommendation and "120.0 batches/s" in finding.recommendation


def test_probe_suggestion_is_used_from_a_summary_read_back():
    summary = make(
        8.0, num_workers=0, probes=Probes(num_workers=NumWorkersProbe(suggested=2, reason="measured"))
    )
    loaded = RunSummary.from_dict(json.loads(json.dumps(summary.to_dict())))
    assert loaded.probes == summary.probes
    assert by_id(diagnose(loaded), "input_bound").settings_change == {"num_workers": 2}


def test_probe_finding_nothing_faster_changes_nothing():
    probe = NumWorkersProbe(suggested=4, reason="the input pipeline cannot keep up")
    finding = by_id(diagnose(make(30.0, num_workers=4, probes=Probes(num_workers=probe))), "input_bound")
    assert finding.settings_change == {}
    assert "will not help" in finding.recommendation and "cannot keep up" in finding.recommendation


def test_estimate_from_main_process_loading():
    # 0 workers: a batch loads in the 30 ms wait, computes in 10 ms -> ceil(1.2 * 30 / 10) = 4 workers
    summary = make(75.0, step_ms=40, wait_ms=30, compute_ms=10, num_workers=0, cpu_count=16)
    assert by_id(diagnose(summary), "input_bound").settings_change == {"num_workers": 4}


def test_estimate_from_workers_that_cannot_keep_up():
    # 2 workers deliver one batch per 20 ms step -> a batch takes ~40 ms; compute 10 ms -> ceil(4.8) = 5
    summary = make(50.0, step_ms=20, wait_ms=10, num_workers=2, cpu_count=16)
    finding = by_id(diagnose(summary), "input_bound")
    assert finding.settings_change == {"num_workers": 5}
    assert "40.0 ms to load" in finding.recommendation


def test_estimate_is_capped_at_lightnings_bound_per_local_process():
    summary = make(75.0, step_ms=40, wait_ms=30, compute_ms=10, num_workers=0, cpu_count=4)
    assert by_id(diagnose(summary), "input_bound").settings_change == {"num_workers": 3}  # 4 // 1 - 1
    summary = make(75.0, step_ms=40, wait_ms=30, compute_ms=10, num_workers=0, cpu_count=8, devices=2)
    assert by_id(diagnose(summary), "input_bound").settings_change == {"num_workers": 3}  # 8 // 2 - 1


def test_workers_already_at_the_core_bound():
    summary = make(40.0, step_ms=20, wait_ms=8, num_workers=3, cpu_count=4)
    finding = by_id(diagnose(summary), "input_bound")
    assert finding.settings_change == {}
    assert "cheaper" in finding.recommendation


def test_unknown_workers_and_cores_recommend_without_a_value():
    finding = by_id(diagnose(make(40.0)), "input_bound")
    assert finding.settings_change == {}
    assert "num_workers" in finding.recommendation


# --- DataLoader settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize("accelerator", ["cuda", "gpu", "CUDA"])
def test_pin_memory_on_cuda(accelerator):
    finding = by_id(diagnose(make(25.0, accelerator=accelerator, pin_memory=False)), "pin_memory")
    assert finding.settings_change == {"pin_memory": True}
    assert finding.severity == "medium"
    assert "25.0%" in finding.evidence


def test_pin_memory_is_low_severity_when_not_input_bound():
    assert by_id(diagnose(make(1.0, accelerator="cuda", pin_memory=False)), "pin_memory").severity == "low"


@pytest.mark.parametrize(
    ("accelerator", "pin"), [("cpu", False), ("cuda", True), ("cuda", None), (None, False), ("mps", False)]
)
def test_no_pin_memory_finding(accelerator, pin):
    assert by_id(diagnose(make(25.0, accelerator=accelerator, pin_memory=pin)), "pin_memory") is None


def epoch_start(start_ms: float, **settings) -> RunSummary:
    # 100 steps in 1 epoch at 10 ms: a 1000 ms epoch plus its start-up
    timing = {"epochs": 1, "epoch_start_ms": dist(start_ms)}
    return make(1.0, step_ms=10.0, timing=timing, **settings)


def test_persistent_workers_at_the_epoch_share_threshold():
    # share = start / (1000 + start): 5% is reached at 52.6 ms
    finding = by_id(
        diagnose(epoch_start(60.0, num_workers=4, persistent_workers=False)), "persistent_workers"
    )
    assert finding.settings_change == {"persistent_workers": True}
    assert "60.0 ms" in finding.evidence and "5.7%" in finding.evidence
    assert (
        by_id(diagnose(epoch_start(52.0, num_workers=4, persistent_workers=False)), "persistent_workers")
        is None
    )


@pytest.mark.parametrize(
    "settings",
    [
        {"num_workers": 0, "persistent_workers": False},
        {"num_workers": 4, "persistent_workers": True},
        {"num_workers": 4, "persistent_workers": None},
        {"num_workers": None, "persistent_workers": False},
    ],
)
def test_no_persistent_workers_finding(settings):
    assert by_id(diagnose(epoch_start(500.0, **settings)), "persistent_workers") is None


def test_persistent_workers_needs_the_epoch_start_measured():
    summary = make(1.0, step_ms=10.0, timing={"epochs": 1}, num_workers=4, persistent_workers=False)
    assert by_id(diagnose(summary), "persistent_workers") is None


@pytest.mark.parametrize(("current", "suggested"), [(None, 4), (2, 4), (4, 8)])
def test_prefetch_factor_when_workers_are_still_input_bound(current, suggested):
    finding = by_id(diagnose(make(10.0, num_workers=4, prefetch_factor=current)), "prefetch_factor")
    assert finding.settings_change == {"prefetch_factor": suggested}
    assert "10.0%" in finding.evidence


@pytest.mark.parametrize(("pct", "workers"), [(4.99, 4), (30.0, 0), (30.0, None)])
def test_no_prefetch_factor_finding(pct, workers):
    assert by_id(diagnose(make(pct, num_workers=workers)), "prefetch_factor") is None


# --- cuDNN, GPU utilization, precision -------------------------------------------------------------------

CONV_ON_CUDA = {"accelerator": "cuda", "model_has_conv": True, "cudnn_benchmark": False}


def test_cudnn_benchmark_with_constant_shapes():
    finding = by_id(diagnose(make(**CONV_ON_CUDA, input_shapes_vary=False)), "cudnn_benchmark")
    assert finding.settings_change == {"benchmark": True}
    assert finding.severity == "medium"
    assert "Trainer(benchmark=True)" in finding.recommendation


def test_cudnn_benchmark_explains_varying_shapes():
    finding = by_id(diagnose(make(**CONV_ON_CUDA, input_shapes_vary=True)), "cudnn_benchmark")
    assert finding.settings_change == {}
    assert finding.severity == "info"
    assert "vary" in finding.evidence and "re-tunes" in finding.recommendation


def test_cudnn_benchmark_with_unknown_shapes_is_conditional():
    finding = by_id(diagnose(make(**CONV_ON_CUDA)), "cudnn_benchmark")
    assert finding.severity == "low"
    assert "same shape" in finding.recommendation


def test_cudnn_benchmark_is_not_recommended_against_determinism():
    finding = by_id(diagnose(make(**CONV_ON_CUDA, cudnn_deterministic=True)), "cudnn_benchmark")
    assert finding.settings_change == {}
    assert finding.severity == "info"


@pytest.mark.parametrize(
    "change",
    [{"model_has_conv": False}, {"model_has_conv": None}, {"cudnn_benchmark": True}, {"accelerator": "cpu"}],
)
def test_no_cudnn_benchmark_finding(change):
    assert by_id(diagnose(make(**{**CONV_ON_CUDA, **change})), "cudnn_benchmark") is None


@pytest.mark.parametrize(("util", "found"), [(10.0, True), (49.9, True), (50.0, False), (95.0, False)])
def test_low_gpu_util_threshold(util, found):
    finding = by_id(diagnose(make(2.0, gpu={"util_pct": util}, batch_size=32)), "low_gpu_util")
    assert (finding is not None) == found
    if found:
        assert finding.settings_change == {"batch_size": 64}
        assert f"{util:.1f}%" in finding.evidence
        assert ".item()" in finding.recommendation


def test_low_gpu_util_needs_not_input_bound_and_both_figures():
    assert by_id(diagnose(make(25.0, gpu={"util_pct": 10.0})), "low_gpu_util") is None
    assert by_id(diagnose(make(None, gpu={"util_pct": 10.0})), "low_gpu_util") is None
    assert by_id(diagnose(make(2.0, gpu={"util_pct": None})), "low_gpu_util") is None
    assert by_id(diagnose(make(2.0, gpu={"util_pct": 10.0})), "low_gpu_util").settings_change == {}


@pytest.mark.parametrize(
    ("cc", "target"),
    [
        ([6, 1], None),
        ([7, 0], "16-mixed"),
        ([7, 5], "16-mixed"),
        ([8, 0], "bf16-mixed"),
        ([9, 0], "bf16-mixed"),
    ],
)
def test_mixed_precision_by_compute_capability(cc, target):
    summary = make(
        gpu={"compute_capability": cc, "device_name": "Test GPU"}, accelerator="cuda", precision="32-true"
    )
    finding = by_id(diagnose(summary), "mixed_precision")
    if target is None:
        assert finding is None
    else:
        assert finding.settings_change == {"precision": target}
        assert f"{cc[0]}.{cc[1]}" in finding.evidence and "Test GPU" in finding.evidence


@pytest.mark.parametrize(
    ("precision", "found"),
    [
        (None, True),
        ("32", True),
        ("32-true", True),
        ("bf16-mixed", False),
        ("16-mixed", False),
        ("64-true", False),
    ],
)
def test_mixed_precision_only_from_full_precision(precision, found):
    summary = make(gpu={"compute_capability": [7, 0]}, accelerator="gpu", precision=precision)
    assert (by_id(diagnose(summary), "mixed_precision") is not None) == found


def test_mixed_precision_needs_cuda_and_capability():
    assert (
        by_id(diagnose(make(gpu={"compute_capability": [8, 0]}, accelerator="cpu")), "mixed_precision")
        is None
    )
    assert (
        by_id(diagnose(make(gpu={"compute_capability": None}, accelerator="cuda")), "mixed_precision") is None
    )
    assert by_id(diagnose(make(accelerator="cuda")), "mixed_precision") is None


# --- validation, checkpoints, CPU ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("finding_id", "field", "key"),
    [
        ("validation_share", "validation_s", "check_val_every_n_epoch"),
        ("checkpoint_share", "checkpoint_s", "every_n_epochs"),
    ],
)
def test_overhead_share_threshold(finding_id, field, key):
    assert by_id(diagnose(make(timing={field: 9.99, "train_wall_s": 100.0})), finding_id) is None
    finding = by_id(diagnose(make(timing={field: 10.0, "train_wall_s": 100.0})), finding_id)
    assert "10.0 s of 100.0 s" in finding.evidence and "10.0%" in finding.evidence
    assert finding.settings_change == {key: 2}
    # 50 of 100 s: running it every 10th time brings it to 5 / 55 s = 9.1%, under the 10% line
    assert by_id(diagnose(make(timing={field: 50.0, "train_wall_s": 100.0})), finding_id).settings_change == {
        key: 10
    }


@pytest.mark.parametrize(
    "timing", [{"validation_s": 5.0, "train_wall_s": 0.0}, {"validation_s": 0.0, "train_wall_s": 9.0}]
)
def test_no_overhead_finding_without_measurements(timing):
    assert by_id(diagnose(make(timing=timing)), "validation_share") is None


def test_workers_exceed_cores():
    finding = by_id(diagnose(make(num_workers=8, cpu_count=4)), "workers_exceed_cores")
    assert finding.settings_change == {"num_workers": 3}
    assert "8 worker processes on 4 usable cores" in finding.evidence
    assert by_id(diagnose(make(num_workers=4, cpu_count=4)), "workers_exceed_cores") is None
    # cores from the utilization sampler when the settings lack them
    assert by_id(diagnose(make(num_workers=8, cpu={"cpu_count": 4})), "workers_exceed_cores") is not None
    assert by_id(diagnose(make(num_workers=8)), "workers_exceed_cores") is None


def test_workers_exceed_cores_counts_every_local_process():
    finding = by_id(diagnose(make(num_workers=3, cpu_count=4, devices=2)), "workers_exceed_cores")
    assert finding.settings_change == {"num_workers": 1}
    assert "3 workers x 2 processes = 6" in finding.evidence


@pytest.mark.parametrize(("busy", "found"), [(359.0, False), (360.0, True), (400.0, True)])
def test_workers_saturated_threshold(busy, found):
    finding = by_id(diagnose(make(25.0, num_workers=4, cpu={"workers_cpu_pct": busy})), "workers_saturated")
    assert (finding is not None) == found
    if found:
        assert finding.severity == "medium"
        assert f"{busy:.1f}% CPU" in finding.evidence and f"{busy / 4:.1f}% of a core" in finding.evidence


def test_workers_saturated_prefers_the_workers_seen_and_is_low_when_not_input_bound():
    summary = make(1.0, num_workers=8, cpu={"workers_cpu_pct": 190.0, "num_workers_seen": 2})
    finding = by_id(diagnose(summary), "workers_saturated")
    assert finding.severity == "low"
    assert "2 workers" in finding.evidence
    assert (
        by_id(diagnose(make(1.0, num_workers=0, cpu={"workers_cpu_pct": 190.0})), "workers_saturated") is None
    )
    assert (
        by_id(diagnose(make(1.0, num_workers=4, cpu={"workers_cpu_pct": None})), "workers_saturated") is None
    )


# --- stragglers ------------------------------------------------------------------------------------------


def ranks(step_times, waits=None):
    waits = waits or [None] * len(step_times)
    return [
        RankStats(rank=i, host=f"node{i // 2}", step_time_ms=s, data_wait_ms=w)
        for i, (s, w) in enumerate(zip(step_times, waits, strict=True))
    ]


def test_straggler_step_time_threshold():
    finding = by_id(diagnose(make(ranks=ranks([10.0, 10.0, 10.0, 12.1]))), "straggler")
    assert "rank 3 (node1)" in finding.title
    assert "takes 12.1 ms a step, against 10.0 ms for the median of the other 3 ranks (+2.1 ms, 1.21x)" in (
        finding.evidence
    )
    assert by_id(diagnose(make(ranks=ranks([10.0, 10.0, 10.0, 12.0]))), "straggler") is None


def test_straggler_ignores_sub_millisecond_gaps():
    assert by_id(diagnose(make(ranks=ranks([1.0, 1.0, 1.0, 1.9]))), "straggler") is None


def test_straggler_by_data_wait_with_missing_values():
    summary = make(ranks=ranks([20.0, 20.0, None], waits=[1.0, 9.0, None]))
    finding = by_id(diagnose(summary), "straggler")
    assert "rank 1 (node0)" in finding.title and "rank 0" not in finding.title
    # rank 2 unknown; rank 0 waits inside its compute (19 ms against rank 1's 11 ms) for rank 1's input
    assert (
        "takes 20.0 ms a step not counting its estimated wait in the gradient all-reduce, against 12.0 ms"
        in (finding.evidence)
    )
    assert (
        "Its DataLoader wait differs most: 9.0 ms a step against 1.0 ms median of the others"
        in finding.evidence
    )
    assert by_id(diagnose(summary), "collective_wait").title == "Rank 0 waits for rank 1 in collectives"


def test_no_straggler_with_one_rank():
    assert by_id(diagnose(make(ranks=ranks([10.0]))), "straggler") is None


# --- ordering, JSON, rendering ---------------------------------------------------------------------------


def busy_summary() -> RunSummary:
    return make(
        43.2,
        step_ms=12.1,
        wait_ms=5.3,
        num_workers=0,
        cpu_count=8,
        pin_memory=False,
        accelerator="cuda",
        precision="32-true",
        model_has_conv=True,
        cudnn_benchmark=False,
        input_shapes_vary=True,
        gpu={"compute_capability": [8, 0], "util_pct": 30.0},
        timing={"validation_s": 30.0, "train_wall_s": 100.0},
        ranks=ranks([10.0, 12.4]),  # a medium straggler: the other rank loses 19% of its step
    )


def test_findings_are_ordered_by_severity():
    findings = diagnose(busy_summary())
    ranks_seen = [SEVERITY_ORDER.index(f.severity) for f in findings]
    assert ranks_seen == sorted(ranks_seen)
    assert findings[0].id == "input_bound"
    assert {f.id for f in findings} >= {
        "pin_memory",
        "cudnn_benchmark",
        "mixed_precision",
        "validation_share",
        "straggler",
    }
    assert findings[-1].severity == "info"


def test_findings_round_trip_through_the_summary_json():
    summary = busy_summary()
    summary.findings = diagnose(summary)
    summary.probes.num_workers = NumWorkersProbe(suggested=2, reason="measured")
    loaded = RunSummary.from_dict(json.loads(json.dumps(summary.to_dict())))
    assert loaded.findings == summary.findings
    assert by_id(diagnose(loaded), "input_bound").settings_change == {"num_workers": 2}


def test_every_settings_change_key_has_a_target():
    for finding in diagnose(busy_summary()):
        assert set(finding.settings_change) <= set(diagnosis.SETTING_TARGETS)


def test_markdown_report_states_verdict_numbers_and_changes():
    summary = busy_summary()
    text = render_markdown(diagnose(summary), summary)
    assert text.startswith("## lightning-perf diagnosis: run-a")
    assert "**Verdict: highly input-bound.**" in text
    assert "43.2% of step time (over all 100 timed steps: mean step 12.1 ms, mean wait 5.3 ms)" in text
    assert "| Severity | Finding | Evidence | Recommendation | Settings change |" in text
    assert "`pin_memory=True`" in text and "`precision='bf16-mixed'`" in text
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert all(row.count(" | ") == 4 for row in rows)  # no cell broke the table


def test_markdown_escapes_pipes_in_cells():
    summary = make(1.0)
    finding = diagnosis.Finding("x", "low", "a | b", "c", "d", {})
    text = render_markdown([finding], summary)
    assert "a \\| b" in text


def test_markdown_without_timing_says_unknown():
    text = render_markdown([], RunSummary())
    assert "unknown" in text and "nothing to change" in text


def test_markdown_not_input_bound():
    summary = make(2.5, step_ms=10.0, wait_ms=0.25)
    text = render_markdown(diagnose(summary), summary)
    assert "**Verdict: not input-bound.**" in text and "2.5%" in text


def test_console_block_is_compact():
    findings = diagnose(busy_summary())
    text = render_console(findings, max_lines=3)
    lines = text.splitlines()
    assert lines[0].startswith("lightning-perf: highly input-bound - DataLoader wait is 43.2%")
    assert lines[1].split() == ["severity", "finding", "what", "to", "do"]  # a table drawn by rich
    rows = [line.split(None, 1) for line in lines[3:-1]]
    assert len(rows) == 3 and all(len(line) <= CONSOLE_WIDTH for line in lines[1:])
    # 0 workers: a batch loads in the 5.3 ms wait and computes in 12.1 - 5.3 ms -> ceil(1.2 * 5.3 / 6.8) = 1
    assert rows[0][0] == "high" and rows[0][1].endswith("set `num_workers=1`")
    assert "Training is highly input-bound" in rows[0][1]
    assert any(r[1].startswith("pin_memory is off while training on CUDA") for r in rows)
    assert lines[-1] == "2 more in perf_summary.json and TensorBoard's Text tab"


def test_console_without_timing():
    assert render_console([]) == "lightning-perf: no timing data"


def test_probe_is_a_table_not_a_chart():
    probe = NumWorkersProbe(
        candidates=[
            {"num_workers": 0, "batches_per_sec": 40.0, "startup_ms": 1.0, "error": None},
            {"num_workers": 2, "batches_per_sec": None, "startup_ms": None, "error": "worker died | code 1"},
        ],
        compute_batches_per_sec=80.0,
        suggested=2,
        reason="measured",
    )
    lines = render_probe_markdown(probe).splitlines()
    table = [line for line in lines if line.startswith("|")]
    assert table[0] == "| num_workers | batches/s | start-up (ms) | error |"
    assert table[2] == "| 0 | 40.0 | 1.0 |  |"
    assert table[3] == "| 2 | n/a | n/a | worker died \\| code 1 |"  # the pipe does not split the row
    assert "The model computes 80.0 batches/s." in lines and "Suggested: `num_workers=2`. measured" in lines


# --- advice in the user's own terms: the setting they set, never one that turns validation off --------------

VALIDATION_HEAVY = {"validation_s": 30.0, "train_wall_s": 100.0}  # 30%: must run 4x less often


@pytest.mark.parametrize(
    ("settings", "change"),
    [
        # a fraction of an epoch: a larger fraction, not check_val_every_n_epoch (which max_epochs=1 never reaches)
        (dict(val_check_interval=0.1, max_epochs=1), {"val_check_interval": 0.4}),
        (dict(val_check_interval=0.25, max_epochs=1), {"val_check_interval": 1.0}),
        (
            dict(val_check_interval=0.5, max_epochs=10),
            {"val_check_interval": 1.0, "check_val_every_n_epoch": 2},
        ),
        # every N batches: every 4N batches, within the epoch
        (
            dict(val_check_interval=50, check_val_every_n_epoch=1, train_batches_per_epoch=500),
            {"val_check_interval": 200},
        ),
        (
            dict(val_check_interval=50, check_val_every_n_epoch=None, train_batches_per_epoch=100),
            {"val_check_interval": 200},
        ),
        # once per epoch: epochs apart, but never past the last epoch
        (
            dict(val_check_interval=1.0, check_val_every_n_epoch=1, max_epochs=20),
            {"check_val_every_n_epoch": 4},
        ),
        (
            dict(val_check_interval=1.0, check_val_every_n_epoch=1, max_epochs=3),
            {"check_val_every_n_epoch": 3},
        ),
        (dict(val_check_interval=1.0, check_val_every_n_epoch=1, max_epochs=1), {"limit_val_batches": 0.25}),
        (dict(max_epochs=1, limit_val_batches=40), {"limit_val_batches": 10}),
    ],
)
def test_validation_advice_uses_the_users_setting_and_never_turns_validation_off(settings, change):
    finding = by_id(diagnose(make(timing=VALIDATION_HEAVY, **settings)), "validation_share")
    assert finding.settings_change == change
    for key, value in change.items():
        assert f"`{key}={value!r}`" in finding.recommendation


def test_checkpoint_advice_never_leaves_a_run_without_checkpoints():
    timing = {"checkpoint_s": 30.0, "train_wall_s": 100.0}
    assert by_id(diagnose(make(timing=timing, max_epochs=2)), "checkpoint_share").settings_change == {
        "every_n_epochs": 2
    }
    one_epoch = by_id(diagnose(make(timing=timing, max_epochs=1)), "checkpoint_share")
    assert one_epoch.settings_change == {} and "every_n_train_steps" in one_epoch.recommendation


# ---------------------------------------------------------------------------------- verdicts under noise


def test_a_wait_share_near_a_line_is_worded_by_its_interval():
    from lightning_perf.analysis.summary import MachineState

    near = RunSummary(
        timing=TimingSummary(data_wait_pct=18.0, data_wait_pct_low=14.0, data_wait_pct_high=22.0),
        settings=Settings(num_workers=0, cpu_count=4),
    )
    (finding,) = [f for f in diagnose(near) if f.id == "input_bound"]
    # one verdict a card: the estimate's grade, and the line its interval crosses (issue 49)
    assert finding.title == "Training is moderately input-bound (its 95% interval crosses the 20.0% line)"
    assert "95% interval 14.0-22.0%" in finding.evidence and "across the 20.0% line" in finding.evidence
    wide = RunSummary(timing=TimingSummary(data_wait_pct=8.0, data_wait_pct_low=2.0, data_wait_pct_high=30.0))
    (finding,) = [f for f in diagnose(wide) if f.id == "input_bound"]
    assert finding.title == (
        "Training is moderately input-bound (its 95% interval crosses the 5.0% and 20.0% lines)"
    )
    assert "across the 5.0% and 20.0% lines" in finding.evidence
    clear = RunSummary(
        timing=TimingSummary(data_wait_pct=45.0, data_wait_pct_low=40.0, data_wait_pct_high=50.0)
    )
    (finding,) = [f for f in diagnose(clear) if f.id == "input_bound"]
    assert finding.title == "Training is highly input-bound" and "across" not in finding.evidence

    quiet = RunSummary(machine=MachineState(cpu_count=2, other_cores=0.05, steal_pct=0.0))
    assert not [f for f in diagnose(quiet) if f.id == "noisy_machine"]
    busy = RunSummary(
        timing=TimingSummary(step_time_ms=Distribution(10, 10.0, 10.0, 14.0, 8.0, 20.0, p10=9.0)),
        machine=MachineState(cpu_count=2, other_cores=0.9, steal_pct=0.0, load_avg_1m=3.1),
    )
    (noisy,) = [f for f in diagnose(busy) if f.id == "noisy_machine"]
    assert "other processes used 0.9 of 2 cores (45.0%)" in noisy.evidence
    assert "timings may be off by" in noisy.evidence and "p10-p90 50.0% of the median" in noisy.evidence
    assert "load average 3.10" in noisy.evidence and "--repeats" in noisy.recommendation


@pytest.mark.parametrize(
    ("pct", "low", "high"), [(3.5, 1.1, 5.8), (8.0, 2.0, 30.0), (18.0, 14.0, 22.0), (21.0, 4.0, 40.0)]
)
def test_a_verdict_card_names_one_grade_and_says_the_interval_spans_others(pct, low, high):
    summary = RunSummary(
        timing=TimingSummary(data_wait_pct=pct, data_wait_pct_low=low, data_wait_pct_high=high)
    )
    (finding,) = [f for f in diagnose(summary) if f.id == "input_bound"]
    named = [grade for grade in ("not input-bound", "moderately", "highly") if grade in finding.title]
    assert len(named) == 1, finding.title
    assert "interval crosses the" in finding.title
    # the card's headline reads the grade of its title
    from lightning_perf.analysis.findings_render import render_markdown
    from lightning_perf.analysis.rules.thresholds import VERDICTS

    (grade,) = [v for v in VERDICTS if v in finding.title]
    assert f"**Verdict: {grade}.**" in render_markdown([finding], summary)
