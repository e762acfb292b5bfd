"""GPU findings worded to what was measured: the A/B's result, the GPU's own wait, every busy measure, TF32."""

from __future__ import annotations

import pytest

from lightning_perf.analysis.diagnosis import diagnose
from lightning_perf.analysis.probe_results import CudnnAB, Probes
from lightning_perf.analysis.rules.inputs.loading import estimate_workers
from tests.analysis.test_diagnosis import by_id, dist, make

CONV = dict(accelerator="cuda", cudnn_benchmark=False, model_has_conv=True, input_shapes_vary=False)


def ab(speedup: float) -> Probes:
    return Probes(cudnn_benchmark=CudnnAB(applies=True, off_ms=10.0 * speedup, on_ms=10.0, speedup=speedup))


def test_cudnn_recommended_only_for_a_measured_gain_and_quoting_it():
    gain = by_id(diagnose(make(probes=ab(1.3), **CONV)), "cudnn_benchmark")
    assert gain.settings_change == {"benchmark": True} and "1.30x" in gain.title + gain.evidence


@pytest.mark.parametrize("speedup", [0.8, 1.02])
def test_cudnn_not_recommended_when_the_ab_measured_a_slowdown_or_noise(speedup):
    finding = by_id(diagnose(make(probes=ab(speedup), **CONV)), "cudnn_benchmark")
    assert finding.settings_change == {} and finding.severity == "info"
    assert f"{speedup:.2f}x" in finding.evidence


def test_cudnn_without_a_measurement_falls_back_to_the_shape_rule():
    probes = Probes(cudnn_benchmark=CudnnAB(applies=False, reason="training on cpu"))
    assert by_id(diagnose(make(probes=probes, **CONV)), "cudnn_benchmark").settings_change == {
        "benchmark": True
    }


def test_gpu_idle_needs_every_busy_measure_to_agree():
    # 30% NVML (averaged over more than the steps) beside 95% kernel-busy: not idle
    assert by_id(diagnose(make(2.0, gpu={"util_pct": 30.0, "kernel_busy_pct": 95.0})), "low_gpu_util") is None
    idle = by_id(diagnose(make(2.0, gpu={"util_pct": 30.0, "kernel_busy_pct": 35.0})), "low_gpu_util")
    assert "NVML utilization over training steps 30.0%" in idle.evidence and "35.0%" in idle.evidence


def test_kernel_busy_stands_in_where_nvml_cannot_answer():
    finding = by_id(diagnose(make(2.0, gpu={"util_pct": None, "kernel_busy_pct": 20.0})), "low_gpu_util")
    assert finding is not None and "kernel-busy from the traces 20.0%" in finding.evidence


def test_input_bound_on_a_gpu_uses_the_gpus_own_wait_and_says_so():
    summary = make(83.0, accelerator="cuda", timing={"gpu_data_wait_pct": 0.4})
    finding = by_id(diagnose(summary), "input_bound")
    assert finding.title == "Training is not input-bound"
    assert "CUDA events" in finding.evidence and "83.0%" in finding.evidence


def test_input_bound_without_events_is_bounded_by_kernel_busy():
    summary = make(83.0, accelerator="cuda", gpu={"kernel_busy_pct": 96.5})
    finding = by_id(diagnose(summary), "input_bound")
    assert finding.title == "Training is not input-bound" and "kernel-busy 96.5%" in finding.evidence
    # on the CPU, no bound applies
    assert (
        by_id(diagnose(make(83.0, accelerator="cpu")), "input_bound").title
        == "Training is highly input-bound"
    )


def test_worker_estimate_uses_gpu_time_per_step():
    summary = make(50.0, step_ms=10.0, wait_ms=5.0, compute_ms=5.0, num_workers=0)
    assert estimate_workers(summary)[0] == 2  # 1.2 * 5 ms load / 5 ms host compute
    summary.timing.gpu_compute_ms = dist(20.0)  # the GPU's step took 20 ms; the host only queued it
    assert estimate_workers(summary)[0] == 1


def test_mixed_precision_from_torchs_compute_capability_with_nvml_off():
    finding = by_id(diagnose(make(accelerator="cuda", compute_capability=[8, 0])), "mixed_precision")
    assert finding.severity == "medium" and finding.settings_change == {"precision": "bf16-mixed"}


def test_mixed_precision_worded_to_tf32_already_on():
    summary = make(accelerator="cuda", compute_capability=[8, 0], float32_matmul_precision="high")
    finding = by_id(diagnose(summary), "mixed_precision")
    assert finding.severity == "low" and "already" in finding.evidence


@pytest.mark.parametrize(("cc", "advice"), [([8, 6], True), ([7, 0], False)])
def test_fp16_mixed_gets_bf16_advice_on_ampere_and_later(cc, advice):
    finding = by_id(
        diagnose(make(accelerator="cuda", compute_capability=cc, precision="16-mixed")), "mixed_precision"
    )
    assert (finding is not None and finding.settings_change == {"precision": "bf16-mixed"}) == advice


def test_pin_memory_silent_when_the_loader_already_yields_cuda_tensors():
    assert by_id(diagnose(make(accelerator="cuda", pin_memory=False)), "pin_memory") is not None
    assert (
        by_id(diagnose(make(accelerator="cuda", pin_memory=False, loader_yields_cuda=True)), "pin_memory")
        is None
    )


def test_new_gpu_fields_round_trip_and_old_summaries_still_load(tmp_path):
    from lightning_perf.analysis.summary import RunSummary

    summary = make(accelerator="cuda", compute_capability=[9, 0], float32_matmul_precision="high")
    summary.timing.gpu_data_wait_pct = 1.5
    summary.timing.gpu_compute_ms = dist(20.0)
    summary.utilization.gpu_metrics_unavailable = {"utilization": "Not Supported"}
    summary.save(tmp_path / "new.json")
    loaded = RunSummary.load(tmp_path / "new.json")
    assert loaded.timing.gpu_compute_ms.median == 20.0 and loaded.settings.compute_capability == [9, 0]
    assert loaded.utilization.gpu_metrics_unavailable == {"utilization": "Not Supported"}
    old = summary.to_dict()
    for section, names in {
        "timing": ("gpu_data_wait_ms", "gpu_compute_ms", "gpu_data_wait_pct"),
        "settings": (
            "compute_capability",
            "float32_matmul_precision",
            "matmul_allow_tf32",
            "loader_yields_cuda",
        ),
        "utilization": ("gpu_metrics_unavailable",),
    }.items():
        for name in names:
            old[section].pop(name)
    restored = RunSummary.from_dict(old)
    assert restored.timing.gpu_data_wait_pct is None and restored.settings.compute_capability is None
    assert restored.utilization.gpu_metrics_unavailable == {}
