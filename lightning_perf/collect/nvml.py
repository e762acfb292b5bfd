"""GPU figures through NVML (nvidia-ml-py): which NVML device each CUDA device is, and reading it.

- :func:`map_cuda_to_nvml` matches the CUDA indices this process trains on (as torch numbers them, after
  CUDA_VISIBLE_DEVICES) to NVML indices by UUID, else by PCI address; :func:`torch_cuda_uuid` and
  :func:`torch_cuda_pci` ask torch for them;
- :class:`NvmlBackend` initialises NVML, resolves the device handles once and reads utilization, memory and
  power per GPU, keyed by the ``perf_gpu/*`` metric tags (:data:`GPU_KEYS`); a metric NVML answers
  NOT_SUPPORTED to is dropped for that GPU;
- :class:`GpuUnavailable` carries the reason NVML cannot measure, for the summary.

The NVML module is passed in (tests pass a fake) and torch is imported only inside the two lookups; nothing
from Lightning. :class:`lightning_perf.collect.utilization.UtilSampler` samples through this backend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning_perf import console
from lightning_perf.analysis import metrics
from lightning_perf.errors import LightningPerfError

log = console.logger(__name__)

# Every GB figure (here and in utilization.py) is 1e9 bytes, as the metric docs say.
BYTES_PER_GB = 1e9

GPU_UTIL = metrics.GPU_UTIL.tag
GPU_MEM_UTIL = metrics.GPU_MEM_UTIL.tag
GPU_MEM_USED = metrics.GPU_MEM_USED.tag
GPU_POWER = metrics.GPU_POWER.tag
GPU_KEYS = (GPU_UTIL, GPU_MEM_UTIL, GPU_MEM_USED, GPU_POWER)

UuidLookup = Callable[[int], "str | None"]
PciLookup = Callable[[int], "tuple[int, int, int] | None"]


class GpuUnavailable(LightningPerfError):
    """NVML cannot measure the GPUs in use; the message is the reason the summary reports."""


def torch_cuda_uuid(cuda_index: int) -> str:
    """UUID of a CUDA device as torch numbers it (after CUDA_VISIBLE_DEVICES)."""
    import torch

    return str(torch.cuda.get_device_properties(cuda_index).uuid)


def torch_cuda_pci(cuda_index: int) -> tuple[int, int, int] | None:
    """(domain, bus, device) PCI address of a CUDA device; None on a torch without these properties."""
    import torch

    p = torch.cuda.get_device_properties(cuda_index)
    return (p.pci_domain_id, p.pci_bus_id, p.pci_device_id) if hasattr(p, "pci_bus_id") else None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)  # old bindings return bytes


def _uuid_key(uuid: str | bytes) -> str:
    # NVML writes "GPU-8f3a...", torch's str(props.uuid) the bare "8f3a..."
    return _text(uuid).strip().lower().removeprefix("gpu-")


def map_cuda_to_nvml(
    nvml: Any, cuda_devices: list[int], uuid_lookup: UuidLookup | None, pci_lookup: PciLookup | None
) -> list[int]:
    """NVML index of each CUDA device index, matched by UUID, else by PCI address (NVML initialised).

    CUDA numbers only the devices CUDA_VISIBLE_DEVICES shows, in the order it lists them; NVML numbers all
    devices on the machine, so CUDA index 0 is NVML index 0 only by chance. The PCI address also matches a
    MIG instance (whose "MIG-..." UUID NVML does not list) to its GPU. Raises GpuUnavailable on no match.
    """
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    by_uuid = {_uuid_key(nvml.nvmlDeviceGetUUID(h)): i for i, h in enumerate(handles)}
    by_pci: dict[tuple[int, int, int], int] | None = None
    indices = []
    for cuda_index in cuda_devices:
        try:
            uuid = uuid_lookup(cuda_index) if uuid_lookup is not None else None
            if uuid is not None and _uuid_key(uuid) in by_uuid:
                indices.append(by_uuid[_uuid_key(uuid)])
                continue
            pci = pci_lookup(cuda_index) if pci_lookup is not None else None
        except Exception as err:  # the lookup is torch (or a test's fake): report it, never raise
            raise GpuUnavailable(f"cannot identify CUDA device {cuda_index}: {err}") from err
        if pci is not None:
            if by_pci is None:
                infos = [nvml.nvmlDeviceGetPciInfo(h) for h in handles]
                by_pci = {(p.domain, p.bus, p.device): i for i, p in enumerate(infos)}
            if tuple(pci) in by_pci:
                indices.append(by_pci[tuple(pci)])
                continue
        raise GpuUnavailable(
            f"CUDA device {cuda_index} (UUID {uuid}, PCI {pci}) is not among the NVML devices"
        )
    return indices


class NvmlBackend:
    """NVML handles of the GPUs this process trains on, resolved once at :meth:`open`."""

    def __init__(self, nvml: Any, indices: list[int]) -> None:
        self._nvml = nvml
        self.indices = indices
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in indices]
        self.names = [_text(nvml.nvmlDeviceGetName(h)) for h in handles]
        try:  # an optional figure: older drivers and bindings lack the call
            self.compute_capability: list[int] | None = [
                int(v) for v in nvml.nvmlDeviceGetCudaComputeCapability(handles[0])
            ]
        except Exception:
            self.compute_capability = None
        # [handle, utilization / memory info / power supported]: a metric NVML answers NOT_SUPPORTED to (power on
        # some boards, utilization on a MIG-enabled GPU) is dropped for that GPU at its first reading
        self._devices = [[h, True, True, True] for h in handles]

    @classmethod
    def open(cls, nvml: Any, cuda_devices: list[int], uuid_lookup: Any, pci_lookup: Any) -> NvmlBackend:
        """Initialise NVML and resolve the devices; raises GpuUnavailable with the reason when it cannot."""
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as err:
            if getattr(err, "value", None) == nvml.NVML_ERROR_LIBRARY_NOT_FOUND:
                raise GpuUnavailable("NVML library not found") from err
            raise GpuUnavailable(f"NVML error: {err}") from err
        try:
            return cls(nvml, map_cuda_to_nvml(nvml, cuda_devices, uuid_lookup, pci_lookup))
        except BaseException as err:
            _shutdown(nvml)
            if isinstance(err, nvml.NVMLError):
                raise GpuUnavailable(f"NVML error: {err}") from err
            raise

    def read(self) -> list[dict[str, float]]:
        """One dict per GPU, keyed by the GPU metric names, holding the metrics it supports."""
        nvml = self._nvml
        rows = []
        for device in self._devices:
            row = {}
            rates = self._read(device, 1, nvml.nvmlDeviceGetUtilizationRates)
            if rates is not None:
                row[GPU_UTIL], row[GPU_MEM_UTIL] = float(rates.gpu), float(rates.memory)
            memory = self._read(device, 2, nvml.nvmlDeviceGetMemoryInfo)
            if memory is not None:
                row[GPU_MEM_USED] = memory.used / BYTES_PER_GB
            power = self._read(device, 3, nvml.nvmlDeviceGetPowerUsage)
            if power is not None:
                row[GPU_POWER] = power / 1000.0  # NVML reports milliwatts
            rows.append(row)
        if not any(supported for device in self._devices for supported in device[1:]):
            raise GpuUnavailable("NVML supports none of utilization, memory and power on these GPUs")
        return rows

    def _read(self, device: list[Any], supported: int, call: Callable[[Any], Any]) -> Any:
        if not device[supported]:
            return None
        try:
            return call(device[0])
        except self._nvml.NVMLError as err:
            if getattr(err, "value", None) != self._nvml.NVML_ERROR_NOT_SUPPORTED:
                raise
            device[supported] = False
            return None

    def close(self) -> None:
        _shutdown(self._nvml)


def _shutdown(nvml: Any) -> None:
    try:  # nvmlInit/nvmlShutdown are reference counted: this releases our init only
        nvml.nvmlShutdown()
    except Exception as err:
        log.debug("lightning-perf: nvmlShutdown failed: %s", err)
