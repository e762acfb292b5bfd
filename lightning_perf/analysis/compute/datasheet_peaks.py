"""GPU datasheet peaks per dtype: dense (no sparsity) tensor-core and FP32/FP64 figures, each with its source.

What the vendor promises, beside what a timed matmul reaches on the run's own device
(:mod:`lightning_perf.probes.device_peak`): the datasheet is the ceiling nobody reaches (boost clocks, ideal
shapes), the measured peak what this device does now. Looked up by the device name NVML or torch gives
("NVIDIA H100 80GB HBM3", "Tesla T4"). Datasheets print sparse figures with an asterisk: the dense ones are
half of those. A device missing here has no datasheet MFU, only the measured one. Pure data: no torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# when the figures below were read from their sources
TABLE_DATE = "2026-12-07"


@dataclass(frozen=True)
class Datasheet:
    name: str
    pattern: str  # a regular expression on the lower-cased device name
    tflops: dict[str, float]  # dtype ("fp64", "fp32", "tf32", "bf16", "fp16") -> dense TFLOP/s
    source: str


_H100 = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_AMPERE = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
# Most specific first: "h100 nvl" before "h100", "a100" before "a10", "l40s" before "l4".
SHEETS: tuple[Datasheet, ...] = (
    Datasheet(
        "H100 NVL",
        r"h100.*nvl",
        {"fp64": 30.0, "fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
        _H100,
    ),
    Datasheet(
        "H100 PCIe",
        r"h100.*pcie",
        {"fp64": 26.0, "fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5},
        _H100,
    ),
    Datasheet(
        "H100 SXM",
        r"h100",
        {"fp64": 34.0, "fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5},
        _H100,
    ),
    Datasheet(
        "H200 NVL",
        r"h200.*nvl",
        {"fp64": 30.0, "fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
        "https://www.nvidia.com/en-us/data-center/h200/",
    ),
    Datasheet(
        "H200 SXM",
        r"h200",
        {"fp64": 34.0, "fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5},
        "https://www.nvidia.com/en-us/data-center/h200/",
    ),
    Datasheet(
        "A100",
        r"a100",
        {"fp64": 9.7, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
        _AMPERE,
    ),
    Datasheet(
        "A10",
        r"\ba10\b",
        {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0},
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/datasheet-new/nvidia-a10-datasheet.pdf",
    ),
    Datasheet(
        "L40S",
        r"l40s",
        {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05},
        "https://www.nvidia.com/en-us/data-center/l40s/",
    ),
    Datasheet(
        "L4",
        r"\bl4\b",
        {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0},
        "https://www.nvidia.com/en-us/data-center/l4/",
    ),
    Datasheet(
        "V100 PCIe",
        r"v100.*pcie",
        {"fp64": 7.0, "fp32": 14.0, "fp16": 112.0},
        "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf",
    ),
    Datasheet(
        "V100 SXM2",
        r"v100",
        {"fp64": 7.8, "fp32": 15.7, "fp16": 125.0},
        "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf",
    ),
    Datasheet(
        "T4",
        r"\bt4\b",
        {"fp32": 8.1, "fp16": 65.0},
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf",
    ),
    Datasheet(
        "GeForce RTX 4090",
        r"rtx 4090",
        # the Ada whitepaper's FP16/BF16 tensor rates with FP32 accumulate (what autocast matmuls use)
        {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2},
        "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf",
    ),
)


def lookup(device_name: str | None, dtype: str) -> tuple[Datasheet, float] | None:
    """The datasheet of ``device_name`` and its dense peak for ``dtype`` in FLOP/s; None when either is unknown."""
    if not device_name:
        return None
    name = device_name.lower()
    for sheet in SHEETS:
        if re.search(sheet.pattern, name):
            tflops = sheet.tflops.get(dtype)
            return (sheet, tflops * 1e12) if tflops else None
    return None
