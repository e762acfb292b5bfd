"""GPU figures through NVML (nvidia-ml-py): the NVML device each CUDA device is, and reading it metric by metric.

- :func:`find_device` looks up the one device a CUDA index is, by UUID (``GPU-...`` for a whole GPU, ``MIG-...``
  for a MIG instance) with ``nvmlDeviceGetHandleByUUID``, else by PCI address. It never enumerates the node:
  on shared (SLURM-style) nodes the GPUs this job may not use answer NO_PERMISSION, and touching them would
  turn sampling off for the GPU the job does own. A MIG instance is read through its own handle (its memory
  is the slice's, not the whole GPU's); the PCI fallback refuses a MIG-enabled parent GPU for the same reason.
  :func:`torch_cuda_uuid` and :func:`torch_cuda_pci` ask torch for the identity.
- :class:`NvmlBackend` initialises NVML, resolves the handles once and reads utilization, memory, power, the SM
  clock and the clock-event ("throttle") reasons per device, keyed by the GPU metric tags of :mod:`lightning_perf.analysis.metrics` (:data:`GPU_KEYS`). NOT_SUPPORTED and NO_PERMISSION are
  answers about one metric on one device (utilization is NOT_SUPPORTED on a MIG instance, power may be
  NO_PERMISSION in a container): that metric is dropped there, with the reason in :attr:`unavailable`,
  and every other metric goes on.
- :class:`GpuUnavailable` carries the reason NVML cannot measure at all, for the summary.

The NVML module is passed in (tests pass a fake) and torch is imported only inside the two lookups; nothing
from Lightning. :class:`lightning_perf.collect.sampling.utilization.UtilSampler` samples through this backend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning_perf import console
from lightning_perf.analysis import metrics
from lightning_perf.analysis.numbers import BYTES_PER_GB
from lightning_perf.errors import LightningPerfError

log = console.logger(__name__)


GPU_UTIL = metrics.GPU_UTIL.tag
GPU_MEM_UTIL = metrics.GPU_MEM_UTIL.tag
GPU_MEM_USED = metrics.GPU_MEM_USED.tag
GPU_POWER = metrics.GPU_POWER.tag
GPU_SM_CLOCK = metrics.GPU_SM_CLOCK.tag
GPU_KEYS = (GPU_UTIL, GPU_MEM_UTIL, GPU_MEM_USED, GPU_POWER, GPU_SM_CLOCK)

# the NVML readings, by the name the summary reports them under when a device cannot give them
UTILIZATION, MEMORY, POWER = "utilization", "memory", "power"
CLOCK, SLOWDOWN = "clock", "clock event reasons"
_CORE_READINGS = frozenset((UTILIZATION, MEMORY, POWER))

# The clock-event reasons (nvml.h ``nvmlClocksEventReason*``, formerly "throttle reasons") that hold a busy GPU's
# clocks below what it could run. Left out on purpose: GPU idle (no work, not a slowdown), application/user and
# display clock settings (a configuration, not a limit hit during the run) and sync boost (multi-GPU clock
# matching). nvidia-smi's "Clocks Event Reasons" section documents each bit.
SLOWDOWN_REASONS = {
    0x4: "power cap",
    0x8: "hardware slowdown",
    0x20: "thermal limit (software)",
    0x40: "thermal limit (hardware)",
    0x80: "power brake",
}
#: the row key of a slowdown reason: 1.0 when the sample had it, 0.0 when not (its mean is the share of samples)
SLOWDOWN_KEY = "slowdown:"

# NVML return codes (nvml.h); the pynvml module carries the same values under these names
_NOT_FOUND_CODES = ("NVML_ERROR_NOT_FOUND", "NVML_ERROR_INVALID_ARGUMENT")
_PER_METRIC_CODES = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_NO_PERMISSION")
_MIG_ENABLED = 1  # NVML_DEVICE_MIG_ENABLE

UuidLookup = Callable[[int], "str | None"]
PciLookup = Callable[[int], "tuple[int, int, int] | None"]


class GpuUnavailable(LightningPerfError):
    """NVML cannot measure the GPUs in use; the message is the reason the summary reports."""


def torch_cuda_uuid(cuda_index: int) -> str:
    """UUID of a CUDA device as torch numbers it (after CUDA_VISIBLE_DEVICES); bare, no GPU-/MIG- prefix."""
    import torch

    return str(torch.cuda.get_device_properties(cuda_index).uuid)


def torch_cuda_pci(cuda_index: int) -> tuple[int, int, int] | None:
    """(domain, bus, device) PCI address of a CUDA device; None on a torch without these properties."""
    import torch

    p = torch.cuda.get_device_properties(cuda_index)
    return (p.pci_domain_id, p.pci_bus_id, p.pci_device_id) if hasattr(p, "pci_bus_id") else None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)  # old bindings return bytes


def uuid_candidates(uuid: str | bytes) -> list[str]:
    """The NVML spellings of a UUID: as given when it carries NVML's prefix, else ``GPU-`` then ``MIG-``.

    torch gives the bare hex form for whole GPUs and MIG instances alike; NVML names a GPU ``GPU-<hex>`` and a
    MIG instance ``MIG-<hex>`` (drivers from R470), hex in lower case.
    """
    text = _text(uuid).strip()
    prefix, _, rest = text.partition("-")
    if prefix.upper() in ("GPU", "MIG") and rest:
        return [f"{prefix.upper()}-{rest.lower()}"]
    return [f"GPU-{text.lower()}", f"MIG-{text.lower()}"]


def _code(nvml: Any, name: str) -> int | None:
    return getattr(nvml, name, None)


def _is(nvml: Any, err: Exception, names: tuple[str, ...]) -> bool:
    return getattr(err, "value", None) in {_code(nvml, name) for name in names} - {None}


def _mig_enabled(nvml: Any, handle: Any) -> bool:
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except Exception:  # NOT_SUPPORTED on GPUs without MIG, absent in old bindings
        return False
    return current == _MIG_ENABLED


def find_device(
    nvml: Any, cuda_index: int, uuid_lookup: UuidLookup | None, pci_lookup: PciLookup | None
) -> Any:
    """The NVML handle of one CUDA device (NVML initialised), by UUID, else by PCI address.

    Raises GpuUnavailable with the reason when the device cannot be found or NVML denies access to it.
    """
    try:
        uuid = uuid_lookup(cuda_index) if uuid_lookup is not None else None
    except Exception as err:  # the lookup is torch (or a test's fake): report it, never raise
        raise GpuUnavailable(f"cannot identify CUDA device {cuda_index}: {err}") from err
    for candidate in uuid_candidates(uuid) if uuid else []:
        try:
            return nvml.nvmlDeviceGetHandleByUUID(candidate)
        except nvml.NVMLError as err:
            if _is(nvml, err, _NOT_FOUND_CODES):
                continue
            raise GpuUnavailable(f"NVML cannot open CUDA device {cuda_index} ({candidate}): {err}") from err
    try:
        pci = pci_lookup(cuda_index) if pci_lookup is not None else None
    except Exception as err:
        raise GpuUnavailable(f"cannot identify CUDA device {cuda_index}: {err}") from err
    if pci is not None:
        domain, bus, device = pci
        try:
            handle = nvml.nvmlDeviceGetHandleByPciBusId(f"{domain:08X}:{bus:02X}:{device:02X}.0")
        except nvml.NVMLError as err:
            if not _is(nvml, err, _NOT_FOUND_CODES):
                raise GpuUnavailable(f"NVML cannot open CUDA device {cuda_index} (PCI {pci}): {err}") from err
        else:
            if _mig_enabled(nvml, handle):
                raise GpuUnavailable(
                    f"CUDA device {cuda_index} is on a MIG-enabled GPU but its MIG instance (UUID {uuid}) was "
                    "not found; the parent GPU's figures would be the whole GPU's, not this slice's"
                )
            return handle
    raise GpuUnavailable(f"CUDA device {cuda_index} (UUID {uuid}, PCI {pci}) is not among the NVML devices")


class _Device:
    """One device's handle and the readings it cannot give (name -> NVML's answer)."""

    __slots__ = ("handle", "uuid", "unavailable")

    def __init__(self, handle: Any, uuid: str) -> None:
        self.handle = handle
        self.uuid = uuid
        self.unavailable: dict[str, str] = {}


class NvmlBackend:
    """NVML handles of the GPUs this process trains on, resolved once at :meth:`open`."""

    def __init__(self, nvml: Any, handles: list[Any]) -> None:
        self._nvml = nvml
        self._devices = [_Device(h, self._optional(nvml.nvmlDeviceGetUUID, h) or "?") for h in handles]
        #: the NVML UUID of each device in use ("GPU-..." or "MIG-...")
        self.uuids = [d.uuid for d in self._devices]
        self.names = [self._optional(nvml.nvmlDeviceGetName, h) or "unknown GPU" for h in handles]
        # optional: older drivers lack the call, a MIG instance may not answer it (torch gives it too)
        capability = self._optional(nvml.nvmlDeviceGetCudaComputeCapability, handles[0])
        self.compute_capability: list[int] | None = [int(v) for v in capability] if capability else None
        #: the highest SM clock each device can run, MHz (None where NVML does not say)
        self.max_sm_clock_mhz = [self._optional(self._max_sm_clock, h) for h in handles]
        # nvidia-ml-py 12.535+ names the call "ClocksEvent"; older ones only "ClocksThrottle"
        self._slowdown_call = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        if self._slowdown_call is None:
            for device in self._devices:
                device.unavailable[SLOWDOWN] = "not in this nvidia-ml-py"

    def _max_sm_clock(self, handle: Any) -> float:
        return float(self._nvml.nvmlDeviceGetMaxClockInfo(handle, self._nvml.NVML_CLOCK_SM))

    def _sm_clock(self, handle: Any) -> float:
        return float(self._nvml.nvmlDeviceGetClockInfo(handle, self._nvml.NVML_CLOCK_SM))

    def _optional(self, call: Callable[[Any], Any], handle: Any) -> Any:
        try:
            value = call(handle)
        except Exception:
            return None
        return _text(value) if isinstance(value, (str, bytes)) else value

    @classmethod
    def open(cls, nvml: Any, cuda_devices: list[int], uuid_lookup: Any, pci_lookup: Any) -> NvmlBackend:
        """Initialise NVML and resolve the devices; raises GpuUnavailable with the reason when it cannot."""
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as err:
            if getattr(err, "value", None) == _code(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND"):
                raise GpuUnavailable("NVML library not found") from err
            raise GpuUnavailable(f"NVML error: {err}") from err
        try:
            return cls(nvml, [find_device(nvml, i, uuid_lookup, pci_lookup) for i in cuda_devices])
        except BaseException as err:
            _shutdown(nvml)
            if isinstance(err, nvml.NVMLError):
                raise GpuUnavailable(f"NVML error: {err}") from err
            raise

    @property
    def unavailable(self) -> dict[str, str]:
        """Readings some device in use cannot give, with NVML's answer (e.g. ``{"utilization": "Not Supported"}``)."""
        merged: dict[str, str] = {}
        for device in self._devices:
            merged.update(device.unavailable)
        return merged

    def read(self) -> list[dict[str, float]]:
        """One dict per GPU, keyed by the GPU metric names, holding the metrics it gives."""
        nvml = self._nvml
        rows = []
        for device in self._devices:
            row = {}
            rates = self._read(device, UTILIZATION, nvml.nvmlDeviceGetUtilizationRates)
            if rates is not None:
                row[GPU_UTIL], row[GPU_MEM_UTIL] = float(rates.gpu), float(rates.memory)
            memory = self._read(device, MEMORY, nvml.nvmlDeviceGetMemoryInfo)
            if memory is not None:  # on a MIG handle: the instance's own memory
                row[GPU_MEM_USED] = memory.used / BYTES_PER_GB
            power = self._read(device, POWER, nvml.nvmlDeviceGetPowerUsage)
            if power is not None:
                row[GPU_POWER] = power / 1000.0  # NVML reports milliwatts
            clock = self._read(device, CLOCK, self._sm_clock)
            if clock is not None:
                row[GPU_SM_CLOCK] = clock
            reasons = self._read(device, SLOWDOWN, self._slowdown_call)
            if reasons is not None:
                for bit, reason in SLOWDOWN_REASONS.items():
                    row[SLOWDOWN_KEY + reason] = 1.0 if int(reasons) & bit else 0.0
            rows.append(row)
        if all(device.unavailable.keys() >= _CORE_READINGS for device in self._devices):
            answers = "; ".join(f"{name}: {why}" for name, why in self.unavailable.items())
            raise GpuUnavailable(
                f"NVML gives none of utilization, memory and power for these GPUs ({answers})"
            )
        return rows

    def _read(self, device: _Device, name: str, call: Callable[[Any], Any]) -> Any:
        if name in device.unavailable:
            return None
        try:
            return call(device.handle)
        except self._nvml.NVMLError as err:
            if not _is(self._nvml, err, _PER_METRIC_CODES):
                raise  # GPU lost, driver gone: the sampler stops
            device.unavailable[name] = str(err)
            return None

    def close(self) -> None:
        _shutdown(self._nvml)


def _shutdown(nvml: Any) -> None:
    try:  # nvmlInit/nvmlShutdown are reference counted: this releases our init only
        nvml.nvmlShutdown()
    except Exception as err:
        log.debug("lightning-perf: nvmlShutdown failed: %s", err)
