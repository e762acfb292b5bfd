"""A fake of the nvidia-ml-py (``pynvml``) module: the calls lightning_perf.collect.sampling.nvml makes, on scripted GPUs.

Pass a :class:`FakeNvml` as ``UtilSampler(nvml=...)``. Readings are scripted per GPU: each read takes the next
value of its list and repeats the last one once the list is used up. Errors carry the same codes and class
names as pynvml's (``NVMLError`` with ``.value``, ``NVMLError_NotSupported``, ...).

It behaves like the real library where the GPU side depends on it:

- a GPU the job may not use (``allowed=False``: SLURM-style cgroups) answers NO_PERMISSION to every call
  that names it, including ``nvmlDeviceGetHandleByIndex``: enumerating the node fails there;
- ``nvmlDeviceGetHandleByUUID`` finds GPUs by ``GPU-...`` and MIG instances by ``MIG-...`` (exact, as NVML
  compares the string), NOT_FOUND otherwise;
- a MIG instance (``FakeGpu.mig``) has its own handle: utilization and power NOT_SUPPORTED, memory its own
  slice; its parent GPU reports MIG mode on, utilization NOT_SUPPORTED and memory NO_PERMISSION unless
  ``FakeNvml(root=True)`` (then the whole GPU's memory, as NVML gives root);
- ``denied``: readings (``"utilization"``, ``"memory"``, ``"power"``, ``"clock"``, ``"reasons"``) answered
  NO_PERMISSION on one device;
- the SM clock (``sm_clock``, scripted, and ``max_sm_clock``) and the clock-event reasons bitmask
  (``clock_reasons``: e.g. ``0x4`` power cap, ``0x1`` idle), under NVML's names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
}


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")


def _error_class(name: str, value: int) -> type[NVMLError]:
    return type(name, (NVMLError,), {"__init__": lambda self: NVMLError.__init__(self, value)})


NVMLError_Uninitialized = _error_class("NVMLError_Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_NotSupported = _error_class("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NoPermission = _error_class("NVMLError_NoPermission", NVML_ERROR_NO_PERMISSION)
NVMLError_NotFound = _error_class("NVMLError_NotFound", NVML_ERROR_NOT_FOUND)
NVMLError_DriverNotLoaded = _error_class("NVMLError_DriverNotLoaded", NVML_ERROR_DRIVER_NOT_LOADED)
NVMLError_LibraryNotFound = _error_class("NVMLError_LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)
NVMLError_GpuIsLost = _error_class("NVMLError_GpuIsLost", NVML_ERROR_GPU_IS_LOST)


@dataclass
class FakeGpu:
    """One GPU as NVML numbers it. A reading set to None is one the board does not support (NOT_SUPPORTED)."""

    uuid: str
    pci: tuple[int, int, int]  # (domain, bus, device)
    name: str = "NVIDIA Fake A100"
    util: list[int] | None = field(default_factory=lambda: [0])
    mem_util: list[int] = field(default_factory=lambda: [0])
    mem_used: list[int] | None = field(default_factory=lambda: [0])  # bytes
    power_mw: list[int] | None = field(default_factory=lambda: [100_000])
    compute_capability: tuple[int, int] = (8, 0)
    sm_clock: list[int] | None = field(default_factory=lambda: [1410])  # MHz
    max_sm_clock: int = 1410
    clock_reasons: list[int] | None = field(default_factory=lambda: [0])  # nvmlClocksEventReason* bits
    mem_total: int = 80 * 10**9  # bytes
    allowed: bool = True  # False: the job may not use it (NO_PERMISSION to everything naming it)
    denied: set[str] = field(default_factory=set)  # readings answered NO_PERMISSION
    mig: list[FakeGpu] = field(default_factory=list)  # MIG instances: non-empty means MIG mode is on
    parent: FakeGpu | None = None  # set on a MIG instance


def mig_instance(uuid: str, parent: FakeGpu, mem_used: int, mem_total: int = 10 * 10**9) -> FakeGpu:
    """A MIG instance of ``parent``: its own memory; utilization and power NOT_SUPPORTED, as on real MIG."""
    gpu = FakeGpu(
        uuid=uuid,
        pci=parent.pci,
        name=f"{parent.name} MIG 1g.10gb",
        util=None,
        mem_used=[mem_used],
        power_mw=None,
        mem_total=mem_total,
        parent=parent,
    )
    parent.mig.append(gpu)
    parent.util = None  # utilization of a MIG-enabled GPU is NOT_SUPPORTED
    return gpu


def _next(values: list[int]) -> int:
    return values.pop(0) if len(values) > 1 else values[0]


class FakeNvml:
    """Stands in for the pynvml module. ``init_error``: raised by nvmlInit; ``read_error``: set it to make
    every later reading raise (an NVML failure mid-run)."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NO_PERMISSION = NVML_ERROR_NO_PERMISSION
    NVML_ERROR_NOT_FOUND = NVML_ERROR_NOT_FOUND
    NVML_ERROR_INVALID_ARGUMENT = NVML_ERROR_INVALID_ARGUMENT
    NVML_ERROR_LIBRARY_NOT_FOUND = NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_CLOCK_SM = 1

    def __init__(self, gpus: list[FakeGpu], init_error: NVMLError | None = None, root: bool = False) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.root = root
        self.read_error: NVMLError | None = None
        self.init_count = 0  # nvmlInit minus nvmlShutdown calls, as NVML's reference count
        self.reads = 0  # utilization readings taken
        self.enumerations = 0  # nvmlDeviceGetCount / nvmlDeviceGetHandleByIndex calls

    # --- library ---
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.init_count += 1

    def nvmlShutdown(self) -> None:
        self._check_init()
        self.init_count -= 1

    def _check_init(self) -> None:
        if self.init_count <= 0:
            raise NVMLError_Uninitialized()

    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        self.enumerations += 1
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._check_init()
        self.enumerations += 1
        return self._allowed(self.gpus[index])

    def _allowed(self, handle: FakeGpu) -> FakeGpu:
        owner = handle.parent or handle
        if not owner.allowed:
            raise NVMLError_NoPermission()
        return handle

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGpu:
        self._check_init()
        for gpu in self.gpus:
            for device in (gpu, *gpu.mig):
                if device.uuid == uuid:
                    return self._allowed(device)
        raise NVMLError_NotFound()

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str) -> FakeGpu:
        self._check_init()
        for gpu in self.gpus:
            domain, bus, device = gpu.pci
            if f"{domain:08X}:{bus:02X}:{device:02X}.0" == bus_id:
                return self._allowed(gpu)
        raise NVMLError_NotFound()

    def nvmlDeviceGetMigMode(self, handle: FakeGpu) -> tuple[int, int]:
        self._check_init()
        if handle.parent is not None:
            raise NVMLError_NotSupported()
        on = 1 if self._allowed(handle).mig else 0
        return on, on

    # --- identity ---
    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        self._check_init()
        return self._allowed(handle).uuid

    def nvmlDeviceGetPciInfo(self, handle: FakeGpu) -> SimpleNamespace:
        self._check_init()
        domain, bus, device = handle.pci
        return SimpleNamespace(
            domain=domain, bus=bus, device=device, busId=f"{domain:08X}:{bus:02X}:{device:02X}.0"
        )

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        self._check_init()
        return handle.name

    def nvmlDeviceGetCudaComputeCapability(self, handle: FakeGpu) -> tuple[int, int]:
        self._check_init()
        return handle.compute_capability

    # --- readings ---
    def _check_read(self, handle: FakeGpu, reading: str) -> None:
        self._check_init()
        if self.read_error is not None:
            raise self.read_error
        self._allowed(handle)
        if reading in handle.denied:
            raise NVMLError_NoPermission()

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> SimpleNamespace:
        self._check_read(handle, "utilization")
        if handle.util is None:
            raise NVMLError_NotSupported()
        self.reads += 1
        return SimpleNamespace(gpu=_next(handle.util), memory=_next(handle.mem_util))

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> SimpleNamespace:
        self._check_read(handle, "memory")
        if handle.mig and not self.root:
            raise NVMLError_NoPermission()  # a MIG-enabled GPU's memory: root only, and then the whole GPU's
        if handle.mem_used is None:
            raise NVMLError_NotSupported()
        used = _next(handle.mem_used)
        return SimpleNamespace(total=handle.mem_total, used=used, free=handle.mem_total - used)

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        self._check_read(handle, "power")
        if handle.power_mw is None:
            raise NVMLError_NotSupported()
        return _next(handle.power_mw)

    def nvmlDeviceGetClockInfo(self, handle: FakeGpu, clock_type: int) -> int:
        self._check_read(handle, "clock")
        if handle.sm_clock is None or clock_type != self.NVML_CLOCK_SM:
            raise NVMLError_NotSupported()
        return _next(handle.sm_clock)

    def nvmlDeviceGetMaxClockInfo(self, handle: FakeGpu, clock_type: int) -> int:
        self._check_read(handle, "clock")
        if handle.sm_clock is None or clock_type != self.NVML_CLOCK_SM:
            raise NVMLError_NotSupported()
        return handle.max_sm_clock

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeGpu) -> int:
        self._check_read(handle, "reasons")
        if handle.clock_reasons is None:
            raise NVMLError_NotSupported()
        return _next(handle.clock_reasons)


def four_gpus() -> FakeNvml:
    """A machine with four GPUs, NVML indices 0-3, on PCI buses 0x10, 0x20, 0x30, 0x40."""
    gpus = [
        FakeGpu(uuid=f"GPU-{i}{i}{i}{i}aaaa-bbbb-cccc-dddd-eeeeeeee000{i}", pci=(0, 0x10 * (i + 1), 0))
        for i in range(4)
    ]
    return FakeNvml(gpus)
