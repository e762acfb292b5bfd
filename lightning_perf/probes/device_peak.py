"""The device's matmul peak, measured: a short timed square matmul of the run's dtype on the run's device.

What this device reaches now, on a CPU as on a GPU, for the MFU of ``compute_limit``: a matmul of
``FIRST_SIZE`` (smaller on a slow device, larger on a fast one: see :func:`measure`), timed call after call
for at most ``BUDGET_S`` in all; the rate is over the timed calls' total time, as the MFU is over the mean step.
On CUDA every timed call ends in a synchronize. Kept per device and dtype in this process and in
``$XDG_CACHE_HOME/lightning-perf/peaks.json`` (``~/.cache`` without it) for ``CACHE_DAYS``, so most fits
pay nothing; a CPU's entry is also keyed by torch's thread count, which sets what its matmul reaches.

A peak timed while other processes held a noisy share of the cores (``NOISY_OTHER_CPU_SHARE``, the noisy-machine
rule's line; read over the timed matmuls as :class:`MachineWatch` reads a run) is what the matmul got beside
them, not the machine's peak: it is kept marked ``busy``, and the next fit whose own run was quiet measures again
(a quiet figure replaces it; of two busy ones the faster is kept, a busy machine only slows a matmul down)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import time
from typing import Any

import torch

from lightning_perf import console
from lightning_perf.analysis.compute.datasheet_peaks import lookup
from lightning_perf.analysis.compute.limit import DevicePeak
from lightning_perf.analysis.numbers import finite
from lightning_perf.analysis.rules.thresholds import NOISY_OTHER_CPU_SHARE
from lightning_perf.atomic_file import atomic_open
from lightning_perf.collect.sampling.machine_state import MachineWatch

log = console.logger(__name__)

# Seconds the measurement takes at most (but for one call past it): the end of fit stays within its 0.5 s
BUDGET_S = 0.1
# a call shorter than this is dominated by the call's own overhead: the size doubles
MIN_CALL_S = 0.005
MIN_SIZE = 128
FIRST_SIZE = {"cpu": 1024, "cuda": 2048}
MAX_SIZE = {"cpu": 1024, "cuda": 8192}
MIN_CALLS = 9  # timed calls at most, within the budget; at least 3, whatever the sizing took
CACHE_DAYS = 7  # a driver, BIOS or torch update can move the peak: measure again after a week
DTYPES = {
    "fp64": torch.float64,
    "fp32": torch.float32,
    "tf32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}
_MEMO: dict[str, DevicePeak] = {}


def cache_path() -> str:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "lightning-perf", "peaks.json")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "cpu"


def peak(device: torch.device, dtype: str, quiet_run: bool = False) -> DevicePeak:
    """The measured peak of ``device`` for ``dtype`` (a :data:`DTYPES` key), from the caches when there; measured
    again where the one there is ``busy`` and ``quiet_run`` (the run asking had the machine to itself)."""
    name = device_name(device)
    key = f"{name}|{dtype}|torch {torch.__version__}"
    if device.type == "cpu":
        key += f"|{torch.get_num_threads()} threads"
    elif dtype == "tf32" or dtype == "fp32":  # what float32 matmuls run on is a process-wide setting
        key += f"|{torch.get_float32_matmul_precision()}"
    found = _MEMO.get(key) or _read_cache(key)
    fresh = _measured(device, dtype, name) if found is None or (found.busy and quiet_run) else None
    if fresh is not None and (found is None or not fresh.busy or _rate(fresh) > _rate(found)):
        result = fresh
        _write_cache(key, result)
    else:
        assert found is not None
        result = dataclasses.replace(found, cached=True, device=str(device))
    _MEMO[key] = result
    sheet = lookup(name, dtype) if device.type == "cuda" else None
    if sheet is not None:
        result.datasheet_device, result.datasheet_source = sheet[0].name, sheet[0].source
        result.datasheet_flops_per_s = sheet[1]
    return result


def _measured(device: torch.device, dtype: str, name: str) -> DevicePeak:
    """A new measurement, with what other processes used of the cores meanwhile."""
    watch = MachineWatch()
    flops_per_s, size = measure(device, DTYPES[dtype])
    machine = watch.finish()
    others = finite(machine.other_cores) if machine is not None else None
    cores = machine.cpu_count if machine is not None else None
    return DevicePeak(
        device=str(device),
        device_name=name,
        dtype=dtype,
        measured_flops_per_s=flops_per_s,
        measured_size=size,
        measured_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        others_cores=others,
        cpu_count=cores,
        busy=others is not None and bool(cores) and others >= NOISY_OTHER_CPU_SHARE * (cores or 0),
    )


def _rate(found: DevicePeak) -> float:
    return found.measured_flops_per_s or 0.0


def measure(device: torch.device, dtype: torch.dtype, budget_s: float | None = None) -> tuple[float, int]:
    """FLOP/s of timed ``n x n @ n x n`` matmuls, and ``n``, in about ``budget_s``. The size starts at
    ``FIRST_SIZE`` (a small matmul's time on a busy machine is the scheduler's: a thread of it waits for a core),
    halves while a call takes over a third of the budget (a slow device) and doubles while a call is shorter than
    ``MIN_CALL_S`` (a fast one), within ``MIN_SIZE`` and ``MAX_SIZE``."""
    budget_s = BUDGET_S if budget_s is None else budget_s
    started = time.perf_counter()
    kind = device.type if device.type in FIRST_SIZE else "cpu"
    size, grown, shrunk = FIRST_SIZE[kind], False, False
    while True:
        a, b = _operands(size, device, dtype)
        _timed(a, b, device)  # the first call also pays for allocation, the kernel's choice, CUDA's set-up
        took = _timed(a, b, device)
        if took > budget_s / 3 and size > MIN_SIZE and not grown:
            size, shrunk = size // 2, True
        elif min(took, _timed(a, b, device)) < MIN_CALL_S and size < MAX_SIZE[kind] and not shrunk:
            size, grown = size * 2, True
        else:
            break
    # the mean rate of the timed calls, as the MFU takes the mean step: on a busy machine both pay alike
    times = [_timed(a, b, device)]
    while len(times) < MIN_CALLS and (len(times) < 3 or time.perf_counter() < started + budget_s):
        times.append(_timed(a, b, device))
    return 2.0 * size**3 * len(times) / sum(times), size


def _operands(size: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(size, size, device=device).to(dtype), torch.randn(size, size, device=device).to(dtype)


def _timed(a: torch.Tensor, b: torch.Tensor, device: torch.device) -> float:
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    torch.mm(a, b)
    if cuda:
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _read_cache(key: str) -> DevicePeak | None:
    try:
        with open(cache_path(), encoding="utf-8") as handle:
            entry = json.load(handle).get(key)
        measured = datetime.datetime.fromisoformat(entry["measured_at"])
        age = datetime.datetime.now(datetime.timezone.utc) - measured
        if age > datetime.timedelta(days=CACHE_DAYS) or not entry["measured_flops_per_s"] > 0:
            return None
        # an entry of an earlier version has no busy mark, and may have been timed beside others' work (one taken
        # beside two CPU hogs read 16.8 GFLOP/s where the machine does 150, and a CNN's MFU of 7% read 67%): it
        # counts as busy, so the next quiet run measures again
        fields = {k: entry[k] for k in _CACHED if k in entry}
        fields.setdefault("busy", True)
        return DevicePeak(**fields)
    except Exception:  # no cache yet, or one this version cannot read: measure
        return None


_CACHED = (
    "device",
    "device_name",
    "dtype",
    "measured_flops_per_s",
    "measured_size",
    "measured_at",
    "others_cores",
    "cpu_count",
    "busy",
)


def _write_cache(key: str, result: DevicePeak) -> None:
    path = cache_path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        entries: dict[str, Any] = {}
        if os.path.exists(path):
            with open(path, encoding="utf-8") as handle:
                entries = json.load(handle)
        entries[key] = {k: getattr(result, k) for k in _CACHED}
        with atomic_open(path) as handle:
            json.dump(entries, handle, indent=1)
    except Exception as err:  # an unwritable home: measure again next time
        log.debug(f"lightning-perf: could not cache the device's peak in {path}: {err}")
