"""NVML on shared nodes and under MIG: the rank's own device found by UUID, readings refused one by one."""

from __future__ import annotations

import pytest

from lightning_perf.collect.sampling.nvml import GPU_MEM_USED, GPU_POWER, GPU_UTIL
from lightning_perf.collect.sampling.utilization import UtilSampler
from tests.fake_nvml import FakeGpu, FakeNvml, four_gpus, mig_instance

LONG_INTERVAL_S = 3600.0


@pytest.fixture
def sampler_factory():
    made: list[UtilSampler] = []

    def make(nvml, uuid, pci=None) -> UtilSampler:
        made.append(
            UtilSampler(
                LONG_INTERVAL_S,
                [0],
                nvml=nvml,
                cuda_uuid_lookup=lambda i: uuid,
                cuda_pci_lookup=(lambda i: pci) if pci else None,
                cpu_interval_s=0.0,
            )
        )
        return made[-1]

    yield make
    for sampler in made:
        sampler.stop()


def bare(uuid: str) -> str:
    """torch's form of a UUID: no GPU-/MIG- prefix."""
    return uuid.split("-", 1)[1]


def test_uuid_spellings():
    from lightning_perf.collect.sampling.nvml import uuid_candidates

    assert uuid_candidates("ABCD-1") == ["GPU-abcd-1", "MIG-abcd-1"]
    assert uuid_candidates(b"gpu-ABCD-1") == ["GPU-abcd-1"]
    assert uuid_candidates("MIG-ABCD-1") == ["MIG-abcd-1"]


def test_shared_node_other_jobs_gpus_answer_no_permission_and_ours_is_still_sampled(sampler_factory):
    nvml = four_gpus()
    for index in (0, 1, 3):
        nvml.gpus[index].allowed = False  # SLURM gave this job GPU 2 only
    nvml.gpus[2].util = [64]
    sampler = sampler_factory(nvml, bare(nvml.gpus[2].uuid))
    sampler.sample_once()
    assert sampler.gpu_unavailable_reason is None
    assert sampler.take_window()[GPU_UTIL] == 64.0
    assert sampler.nvml_uuids == [nvml.gpus[2].uuid]
    assert nvml.enumerations == 0  # the node is never enumerated


def test_a_device_the_job_may_not_read_is_reported_with_nvmls_answer(sampler_factory):
    nvml = four_gpus()
    nvml.gpus[1].allowed = False
    sampler = sampler_factory(nvml, bare(nvml.gpus[1].uuid))
    sampler.sample_once()
    assert "Insufficient Permissions" in sampler.gpu_unavailable_reason
    assert nvml.init_count == 0


def test_a_refused_reading_drops_that_metric_only(sampler_factory):
    nvml = FakeNvml([FakeGpu(uuid="GPU-1", pci=(0, 1, 0), util=[70], mem_used=[3 * 10**9], denied={"power"})])
    sampler = sampler_factory(nvml, "GPU-1")
    sampler.sample_once()
    sampler.sample_once()
    window = sampler.take_window()
    assert window[GPU_UTIL] == 70.0 and window[GPU_MEM_USED] == pytest.approx(3.0)
    assert GPU_POWER not in window
    summary = sampler.summary()
    assert summary.gpu_unavailable_reason is None
    assert summary.gpu_metrics_unavailable == {"power": "Insufficient Permissions"}


@pytest.mark.parametrize("root", [False, True])
def test_mig_instance_is_read_through_its_own_handle(sampler_factory, root):
    nvml = four_gpus()
    nvml.root = root
    parent = nvml.gpus[1]
    parent.mem_used = [60 * 10**9]  # the whole GPU, all slices together
    slice_ = mig_instance("MIG-0f0f0f0f-1111-2222-3333-444444444444", parent, mem_used=2 * 10**9)
    # torch gives the bare UUID; the PCI address is the parent's, which must not be used
    sampler = sampler_factory(nvml, bare(slice_.uuid), pci=parent.pci)
    sampler.sample_once()
    window = sampler.take_window()
    assert sampler.nvml_uuids == [slice_.uuid]
    assert window[GPU_MEM_USED] == pytest.approx(2.0)  # the slice's memory, not 60 GB
    assert GPU_UTIL not in window  # NOT_SUPPORTED on MIG: kernel-busy from traces stands in
    summary = sampler.summary()
    assert summary.gpu.device_name.endswith("MIG 1g.10gb")
    assert summary.gpu_metrics_unavailable["utilization"] == "Not Supported"
    assert nvml.enumerations == 0


def test_pci_fallback_refuses_the_parent_of_an_unfound_mig_instance(sampler_factory):
    nvml = four_gpus()
    parent = nvml.gpus[0]
    mig_instance("MIG-aaaa", parent, mem_used=10**9)
    sampler = sampler_factory(nvml, "ffff-not-listed", pci=parent.pci)
    sampler.sample_once()
    assert "MIG" in sampler.gpu_unavailable_reason
    assert "whole GPU" in sampler.gpu_unavailable_reason


def test_samples_taken_while_paused_are_not_kept(sampler_factory):
    gpu = FakeGpu(uuid="GPU-1", pci=(0, 1, 0), util=[95])
    sampler = sampler_factory(FakeNvml([gpu]), "GPU-1")
    sampler.sample_once()  # a training step: 95 %
    sampler.pause()  # validation: the GPU idles at 5 %
    gpu.util = [5]
    sampler.sample_once()
    sampler.sample_once()
    sampler.resume()
    gpu.util = [85]
    sampler.sample_once()
    assert sampler.summary().gpu.util_pct == pytest.approx(90.0)
