"""Tensor-core figures of one trace: which kernel time is matmul and convolution work, in what precision, and
whether it ran on matrix cores (NVIDIA tensor cores, AMD MFMA).

Each kernel is tied to its operator by correlation (the runtime call that launched it, and the innermost
operator around that call on the host thread) or, for kernels torch.compile wrote, by the compiled region that
launched them (Inductor wraps each Triton launch in a record function named after the kernel). The operator's
name says whether the work is tensor-core eligible (torch-tb-profiler's operator allowlist, and Inductor's
Triton templates ``triton_tem_*``: matmuls and convolutions by construction); its input types (traces recorded
with shapes) say in what precision it ran, and :mod:`lightning_perf.analysis.matrix_cores` decides from them
whether that was on matrix cores, the kernel-name tables of traces/vendors.py where the types cannot tell.

Standard library and numpy. Every question about a name or a type list is asked once per distinct value.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from typing import Any

import numpy as np

from lightning_perf.analysis.matrix_cores import (
    UNKNOWN,
    decide,
    input_dtype,
    matrix_core_split,
    op_kind,
)
from lightning_perf.analysis.trace_figures import TraceFigures
from lightning_perf.traces.figures.intervals import ordered_sum
from lightning_perf.traces.read.columns import SpanColumns, columns_of
from lightning_perf.traces.read.spans import KERNEL_CATS, Span
from lightning_perf.traces.vendors import (  # noqa: F401 (the eligible operators, re-exported)
    TENSOR_CORE_ELIGIBLE,
    TRITON_TEMPLATE_PREFIX,
    is_communication_kernel_name,
    is_matrix_core_kernel,
    is_tensor_core_eligible,
)

# Triton (torch.compile) kernels: their names do not say whether they use tensor cores.
TRITON_PREFIX = "triton_"


def launching_operators(cols: SpanColumns, issuers: dict[int, Any], inner_index: dict[int, int]) -> dict:
    """Correlation id -> span index of the innermost operator around the call with that id (-1: none); of
    two calls with one id, the later in file order counts."""
    calls = sorted(issuers)
    innermost = map(inner_index.get, calls, repeat(-1))  # C-level: no Python step a call
    return dict(zip(cols.correlation[np.array(calls, dtype=np.int64)].tolist(), innermost, strict=True))


def tensor_core_figures(
    figures: TraceFigures,
    spans: Sequence[Span],
    window: tuple[float, float],
    issuers: dict[int, Any],
    inner_index: dict[int, int],
) -> None:
    """torch-tb-profiler's tensor-core figures, by precision first: kernel time counted as matrix-core work,
    eligible kernel time, the part of it without matrix cores (the run's settings unknown: fp32 is decided by
    kernel names unless the GPU has no TF32), and eligible time by kind and precision with its matrix-core
    kernels by name (``tc_eligible_by``), from which the rules decide again with the run's settings."""
    cols = columns_of(spans)
    inside = (cols.start >= window[0]) & (cols.start < window[1])
    kernels = cols.in_cats(KERNEL_CATS) & inside & ~cols.where_name(is_communication_kernel_name)
    durations = cols.end[kernels] - cols.start[kernels]
    total = ordered_sum(durations)
    if total <= 0:
        return
    launcher = launching_operators(cols, issuers, inner_index)
    ops = np.fromiter(map(launcher.get, cols.correlation[kernels].tolist(), [-1] * len(durations)), np.int64)
    has_op = ops >= 0
    op_name = np.where(has_op, cols.name_code[np.maximum(ops, 0)], -1)
    names = cols.names
    eligible_names = np.fromiter(map(is_tensor_core_eligible, names), bool, len(names))
    conv_names = np.fromiter((op_kind(name) == "conv" for name in names), bool, len(names))
    kernel_name = cols.name_code[kernels]
    # a Triton template kernel is matrix work itself, whichever region launched it
    template = np.fromiter((n.startswith(TRITON_TEMPLATE_PREFIX) for n in names), bool, len(names))[
        kernel_name
    ]
    eligible = (has_op & eligible_names[np.maximum(op_name, 0)]) | template
    conv = np.where(has_op & ~template, conv_names[np.maximum(op_name, 0)], conv_names[kernel_name])
    named = cols.where_name(is_matrix_core_kernel)[kernels]
    dtypes = [input_dtype(types) or UNKNOWN for types in cols.input_types]
    dtype_code = np.where(has_op, cols.input_type_code[np.maximum(ops, 0)], 0)
    cc, device = figures.compute_capability, figures.device_name
    by: dict[str, list[float]] = {}
    matrix = named & ~eligible  # kernels of other operators: their names decide
    for key in sorted(
        {f"{'conv' if c else 'matmul'}/{dtypes[d]}" for c, d in _pairs(conv, dtype_code, eligible)}
    ):
        kind, _, dtype = key.partition("/")
        part = eligible & (conv == (kind == "conv")) & _in_dtypes(dtype_code, dtypes, dtype)
        by[key] = [
            100.0 * ordered_sum(durations[part]) / total,
            100.0 * ordered_sum(durations[part & named]) / total,
        ]
        ran = decide(kind, None if dtype == UNKNOWN else dtype, None, cc, device)
        matrix |= part & (named if ran is None else ran)
    figures.tensor_core_pct = 100.0 * ordered_sum(durations[matrix]) / total
    figures.tc_eligible_pct = 100.0 * ordered_sum(durations[eligible]) / total
    figures.tc_eligible_without_tc_pct = 100.0 * ordered_sum(durations[eligible & ~matrix]) / total
    triton = cols.where_name(lambda name: name.startswith(TRITON_PREFIX))[kernels]
    figures.triton_pct = 100.0 * ordered_sum(durations[triton]) / total
    figures.tc_eligible_by = by
    figures.tc_decided_by = ", ".join(matrix_core_split(by, cc, device).reasons()) or None


def _pairs(conv: np.ndarray, dtype_code: np.ndarray, eligible: np.ndarray) -> set[tuple[bool, int]]:
    """The distinct (convolution?, type-list code) pairs of the eligible kernels."""
    return set(zip(conv[eligible].tolist(), dtype_code[eligible].tolist(), strict=True))


def _in_dtypes(dtype_code: np.ndarray, dtypes: list[str], dtype: str) -> np.ndarray:
    """Mask of the kernels whose type-list code means ``dtype``."""
    table = np.fromiter((d == dtype for d in dtypes), bool, len(dtypes))
    return table[dtype_code]
