"""GPU clocks and clock slowdown ("throttle") reasons from NVML: sampled in training steps, kept in the machine
state, and a run whose GPU was held at its power cap says so in a noisy_machine finding."""

from __future__ import annotations

import warnings

from lightning_perf import PerfCallback
from lightning_perf.analysis.diagnosis import diagnose
from lightning_perf.analysis.summary import MachineState, RunSummary
from lightning_perf.collect.sampling import utilization
from lightning_perf.collect.sampling.machine_state import with_gpu_clocks
from lightning_perf.collect.sampling.nvml import GPU_SM_CLOCK, GPU_UTIL, SLOWDOWN
from lightning_perf.collect.sampling.utilization import UtilSampler
from tests.fake_nvml import FakeGpu, FakeNvml
from tests.helpers import TinyModel, loader, trainer

POWER_CAP, IDLE, HW_THERMAL = 0x4, 0x1, 0x40
LONG_INTERVAL_S = 3600.0  # the tests take the samples themselves


def sampler_on(*gpus: FakeGpu, nvml: FakeNvml | None = None) -> UtilSampler:
    nvml = nvml or FakeNvml(list(gpus))
    by_index = {i: gpu.uuid for i, gpu in enumerate(gpus)}
    return UtilSampler(
        LONG_INTERVAL_S,
        list(by_index),
        nvml=nvml,
        cuda_uuid_lookup=lambda i: by_index[i],
        cpu_interval_s=LONG_INTERVAL_S,
    )


def test_sm_clock_and_the_share_of_samples_each_slowdown_held_the_clocks():
    gpu = FakeGpu(
        uuid="GPU-0",
        pci=(0, 1, 0),
        sm_clock=[1980, 1200, 1200, 1200],
        max_sm_clock=1980,
        clock_reasons=[IDLE, POWER_CAP, POWER_CAP, POWER_CAP | HW_THERMAL],
    )
    sampler = sampler_on(gpu)
    try:
        for _ in range(4):
            sampler.sample_once()
        window = sampler.take_window()
        clock, top, slowdown = sampler.gpu_clocks()
    finally:
        sampler.stop()
    assert window[GPU_SM_CLOCK] == (1980 + 3 * 1200) / 4  # logged as perf_gpu/sm_clock_mhz
    assert (clock, top) == ((1980 + 3 * 1200) / 4, 1980.0)
    # idle is not a slowdown; power cap held 3 of 4 samples, the hardware thermal limit 1 of 4
    assert slowdown == {
        "power cap": 75.0,
        "hardware slowdown": 0.0,
        "thermal limit (software)": 0.0,
        "thermal limit (hardware)": 25.0,
        "power brake": 0.0,
    }
    state = with_gpu_clocks(None, sampler)  # no CPU counters read: a state with the GPU figures alone
    assert state is not None and state.gpu_sm_clock_max_mhz == 1980.0
    assert state.gpu_slowdown_pct == {"power cap": 75.0, "thermal limit (hardware)": 25.0}


def test_the_slowest_of_several_gpus_and_samples_taken_between_steps_are_not_kept():
    fast = FakeGpu(uuid="GPU-0", pci=(0, 1, 0), sm_clock=[1980], max_sm_clock=1980)
    slow = FakeGpu(uuid="GPU-1", pci=(0, 2, 0), sm_clock=[1500], max_sm_clock=1980, clock_reasons=[POWER_CAP])
    sampler = sampler_on(fast, slow)
    try:
        sampler.sample_once()
        sampler.paused = True  # validation: the GPU may idle at low clocks, which says nothing of training
        slow.sm_clock, slow.clock_reasons = [300], [IDLE]
        sampler.sample_once()
        clock, top, slowdown = sampler.gpu_clocks()
    finally:
        sampler.stop()
    assert (clock, top) == (1500.0, 1980.0) and slowdown["power cap"] == 100.0


def test_an_nvml_without_the_reasons_call_or_refusing_clocks_keeps_every_other_reading():
    class OldNvml(FakeNvml):
        nvmlDeviceGetCurrentClocksEventReasons = None  # nvidia-ml-py before 12.535 under the new name only

    gpu = FakeGpu(uuid="GPU-0", pci=(0, 1, 0), util=[70], denied={"clock"})
    sampler = sampler_on(gpu, nvml=OldNvml([gpu]))
    try:
        sampler.sample_once()
        window = sampler.take_window()
        unavailable = sampler.gpu_metrics_unavailable
        clocks = sampler.gpu_clocks()
    finally:
        sampler.stop()
    assert window[GPU_UTIL] == 70.0 and GPU_SM_CLOCK not in window
    assert unavailable["clock"] == "Insufficient Permissions" and SLOWDOWN in unavailable
    assert clocks == (None, None, {}) and with_gpu_clocks(None, sampler) is None


def test_noisy_machine_names_the_slowdown_at_and_around_its_line():
    def machine(share: float) -> MachineState:
        return MachineState(
            cpu_count=8,
            other_cores=0.1,
            gpu_sm_clock_mhz=1500.0,
            gpu_sm_clock_max_mhz=1980.0,
            gpu_slowdown_pct={"power cap": share},
        )

    assert not [f for f in diagnose(RunSummary(machine=machine(9.9))) if f.id == "noisy_machine"]
    (finding,) = [f for f in diagnose(RunSummary(machine=machine(10.0))) if f.id == "noisy_machine"]
    assert finding.title == "The GPU's clocks were held down while this run measured"
    assert "power cap in 10.0% of the training samples" in finding.evidence
    assert "SM clock averaged 1500 of 1980 MHz" in finding.evidence
    assert "up to ~24.2% on GPU-bound steps" in finding.evidence  # 1 - 1500/1980
    assert "nvidia-smi -q -d PERFORMANCE" in finding.recommendation


def test_a_fit_on_a_power_capped_gpu_records_the_clocks_and_says_timings_are_off(tmp_path, monkeypatch):
    nvml = FakeNvml(
        [
            FakeGpu(
                uuid="GPU-0", pci=(0, 1, 0), util=[90], sm_clock=[1100], max_sm_clock=1980, clock_reasons=[5]
            )
        ]
    )
    real_sampler = utilization.UtilSampler

    def with_fake_gpu(interval_s, cuda_devices, **kwargs):
        return real_sampler(0.005, [0], nvml=nvml, cuda_uuid_lookup=lambda index: "GPU-0", **kwargs)

    monkeypatch.setattr(utilization, "UtilSampler", with_fake_gpu)
    callback = PerfCallback(probe_num_workers="never", ab_cudnn_benchmark=False, enable_profiler=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer(tmp_path, [callback], limit_train_batches=30).fit(TinyModel(), loader())
    summary = RunSummary.load(callback.last_summary.log_dir)
    assert summary.machine is not None
    assert (summary.machine.gpu_sm_clock_mhz, summary.machine.gpu_sm_clock_max_mhz) == (1100.0, 1980.0)
    assert summary.machine.gpu_slowdown_pct == {"power cap": 100.0}
    (finding,) = [f for f in summary.findings if f.id == "noisy_machine"]
    assert "power cap in 100.0% of the training samples" in finding.evidence
