"""A fake of the nvidia-ml-py (``pynvml``) module: the calls lightning_perf.collect.nvml makes, on scripted GPUs.

Pass a :class:`FakeNvml` as ``UtilSampler(nvml=...)``. Readings are scripted per GPU: each read takes the next
value of its list and repeats the last one once the list is used up. Errors carry the same codes and class
names as pynvml's (``NVMLError`` with ``.value``, ``NVMLError_NotSupported``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
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
    NVML_ERROR_LIBRARY_NOT_FOUND = NVML_ERROR_LIBRARY_NOT_FOUND

    def __init__(self, gpus: list[FakeGpu], init_error: NVMLError | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.read_error: NVMLError | None = None
        self.init_count = 0  # nvmlInit minus nvmlShutdown calls, as NVML's reference count
        self.reads = 0  # utilization readings taken

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
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._check_init()
        return self.gpus[index]

    # --- identity ---
    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        self._check_init()
        return handle.uuid

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
    def _check_read(self) -> None:
        self._check_init()
        if self.read_error is not None:
            raise self.read_error

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> SimpleNamespace:
        self._check_read()
        if handle.util is None:
            raise NVMLError_NotSupported()
        self.reads += 1
        return SimpleNamespace(gpu=_next(handle.util), memory=_next(handle.mem_util))

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> SimpleNamespace:
        self._check_read()
        if handle.mem_used is None:
            raise NVMLError_NotSupported()
        used = _next(handle.mem_used)
        return SimpleNamespace(total=80 * 10**9, used=used, free=80 * 10**9 - used)

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        self._check_read()
        if handle.power_mw is None:
            raise NVMLError_NotSupported()
        return _next(handle.power_mw)


def four_gpus() -> FakeNvml:
    """A machine with four GPUs, NVML indices 0-3, on PCI buses 0x10, 0x20, 0x30, 0x40."""
    gpus = [
        FakeGpu(uuid=f"GPU-{i}{i}{i}{i}aaaa-bbbb-cccc-dddd-eeeeeeee000{i}", pci=(0, 0x10 * (i + 1), 0))
        for i in range(4)
    ]
    return FakeNvml(gpus)
