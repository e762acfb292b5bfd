"""Which module of the model a profiled step's time went to, forward and backward apart.

The callback names each module's forward in the trace (``nn.Module: encoder.layer3.1.conv2``, see
``collect.profiling.module_spans``). A forward operator inside such a span belongs to the innermost one; torch
writes the autograd sequence number on the operator that created a node and on the node's backward
(``autograd::engine::evaluate_function: AddmmBackward0``), so backward time lands on the module whose forward
created it, whichever thread ran it. GPU kernels land where the runtime call that launched them ran (by
correlation id). Times are per profiled step.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from lightning_perf.analysis.trace_figures import ModuleTime, TopOperator
from lightning_perf.traces.read.columns import ColumnsBuilder, SpanColumns, columns_of
from lightning_perf.traces.read.reader import USER_ANNOTATION_CAT
from lightning_perf.traces.read.spans import (
    KERNEL_CATS,
    OPERATOR_CATS,
    RUNTIME_CATS,
    TIME_TOLERANCE_US,
    Span,
    SpanList,
    span_of,
)

MODULE_PREFIX = "nn.Module: "  # as collect.profiling.module_spans names them
BACKWARD_PREFIX = "autograd::engine::evaluate_function: "
COMPILED_PREFIX = "Torch-Compiled Region: "  # dynamo's span around a compiled graph's run
TOP_MODULES = 10
TOP_MODULE_OPERATORS = 3


class _Module:
    def __init__(self, path: str) -> None:
        self.path = path
        self.calls = 0
        self.forward_us = self.forward_self_us = 0.0
        self.backward_self_us = 0.0
        self.gpu_forward_us = self.gpu_backward_us = 0.0
        self.operators: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])  # name -> [calls, us]
        self.parent: str | None = None


def module_times(events: Iterable[Mapping[str, Any] | Span], steps: int) -> list[ModuleTime]:
    """The model's modules in a trace, per step (``steps`` profiled), costliest self time first; [] when the
    trace has no module spans (a trace not recorded by PerfCallback, or a model that ran no module)."""
    cols = _columns(events)
    names = cols.names
    module_name = np.array([name.startswith(MODULE_PREFIX) for name in names], dtype=bool)
    compiled_name = np.array([name.startswith(COMPILED_PREFIX) for name in names], dtype=bool)
    backward_name = np.array([name.startswith(BACKWARD_PREFIX) for name in names], dtype=bool)
    is_module = (
        module_name[cols.name_code] & cols.in_cats({USER_ANNOTATION_CAT}) | compiled_name[cols.name_code]
    )
    if not is_module.any():
        return []
    is_operator = cols.in_cats(OPERATOR_CATS)
    is_runtime = cols.in_cats(RUNTIME_CATS)
    kernel_us = _kernel_time_by_correlation(cols)
    order, threads = cols.nesting_order(is_module | is_operator | is_runtime)
    modules: dict[str, _Module] = {}
    created_by: dict[int, str] = {}  # sequence number -> the module whose forward created the node
    walk = list(zip(order.tolist(), threads.tolist(), strict=True))
    _forward_pass(walk, cols, is_module, backward_name, modules, created_by)
    # a second pass for the GPU: a backward node's launches may be walked (on the autograd thread) before the
    # forward that created it (on the training thread)
    if kernel_us:
        _kernel_pass(walk, cols, is_module, is_runtime, backward_name, kernel_us, modules, created_by)
    _charge_backward(cols, is_operator, backward_name, created_by, modules)
    return _figures(modules, max(steps, 1))


_Stack = list[tuple[float, str, Any]]  # the spans open around a span: (end, kind, module path or span index)


def _nested(walk: list[tuple[int, int]], cols: Any) -> Iterator[tuple[int, float, float, _Stack]]:
    """Each span of ``walk`` in order, with its start and end and the spans still open around it on its thread
    (the caller pushes the span itself when it nests others). Both passes walk the same way."""
    stack: _Stack = []
    thread = None
    for index, span_thread in walk:
        start, end = float(cols.start[index]), float(cols.end[index])
        if span_thread != thread:
            stack.clear()
            thread = span_thread
        while stack and stack[-1][0] <= start + TIME_TOLERANCE_US:
            stack.pop()
        yield index, start, end, stack


def _forward_pass(
    walk: list[tuple[int, int]],
    cols: Any,
    is_module: np.ndarray,
    backward_name: np.ndarray,
    modules: dict[str, _Module],
    created_by: dict[int, str],
) -> None:
    """Each module's forward time and calls, the operators called directly in it, and which module created
    each autograd node (the innermost module around the operator that carries its sequence number)."""
    names = cols.names
    for index, start, end, stack in _nested(walk, cols):
        inside = _innermost_module(stack)
        name = names[cols.name_code[index]]
        if is_module[index]:
            path = _path(name)
            module = modules.setdefault(path, _Module(path))
            module.calls += 1
            module.forward_us += end - start
            module.forward_self_us += end - start
            if inside is not None:
                modules[inside].forward_self_us -= end - start
                module.parent = module.parent or inside
            stack.append((end, "module", path))
            continue
        if backward_name[cols.name_code[index]]:
            stack.append((end, "backward", index))
            continue
        if inside is not None:
            sequence = int(cols.sequence[index])
            if sequence >= 0:
                created_by.setdefault(sequence, inside)
            if stack[-1][1] == "module":  # called directly in the module's forward
                entry = modules[inside].operators[name]
                entry[0] += 1
                entry[1] += end - start
        stack.append((end, "operator", index))


def _kernel_pass(
    walk: list[tuple[int, int]],
    cols: Any,
    is_module: np.ndarray,
    is_runtime: np.ndarray,
    backward_name: np.ndarray,
    kernel_us: dict[Any, float],
    modules: dict[str, _Module],
    created_by: dict[int, str],
) -> None:
    """Each launch's kernels to the innermost module forward, or the backward node's module, around it."""
    names = cols.names
    for index, _, end, stack in _nested(walk, cols):
        if is_runtime[index]:
            launched = kernel_us.get(cols.correlation[index], 0.0)
            if launched:
                _charge_kernels(stack, modules, created_by, cols, launched)
        elif is_module[index]:
            stack.append((end, "module", _path(names[cols.name_code[index]])))
        elif backward_name[cols.name_code[index]]:
            stack.append((end, "backward", index))
        else:
            stack.append((end, "operator", index))


def _columns(events: Iterable[Mapping[str, Any] | Span]) -> Any:
    """The columns with each span's sequence number: :func:`load_trace`'s span list has them; event dicts
    (tests, other readers) are read here, since a Span tuple does not carry the number."""
    if type(events) is SpanList or isinstance(events, SpanColumns):
        return columns_of(events)
    spans: list[Span] = []
    sequences: list[int] = []
    for event in events:
        span = event if isinstance(event, Span) else span_of(event)
        if span is None:
            continue
        spans.append(span)
        args = None if isinstance(event, Span) else event.get("args")
        number = args.get("Sequence number") if isinstance(args, dict) else None
        sequences.append(number if type(number) is int and -(2**63) <= number < 2**63 else -1)
    builder = ColumnsBuilder()
    builder.add_spans(spans, sequences=sequences)
    return builder.columns(spans)


def _path(name: str) -> str:
    """A module span's path; a compiled region (one unit: its modules run inside the graph) keeps dynamo's name,
    ``Torch-Compiled Region: 0/5`` (frame 0, its 6th compilation)."""
    return name[len(MODULE_PREFIX) :] if name.startswith(MODULE_PREFIX) else name


def _innermost_module(stack: list[tuple[float, str, Any]]) -> str | None:
    for _, kind, value in reversed(stack):
        if kind == "module":
            return value
    return None


def _kernel_time_by_correlation(cols: Any) -> dict[Any, float]:
    kernels = np.flatnonzero(cols.in_cats(KERNEL_CATS) & cols.has_correlation)
    times: dict[Any, float] = defaultdict(float)
    for index in kernels.tolist():
        times[cols.correlation[index]] += float(cols.end[index] - cols.start[index])
    return times


def _charge_kernels(
    stack: list[tuple[float, str, Any]],
    modules: dict[str, _Module],
    created_by: dict[int, str],
    cols: Any,
    kernel_us: float,
) -> None:
    """A launch's kernels go to the innermost module forward or the module of the backward node around it."""
    for _, kind, value in reversed(stack):
        if kind == "module":
            modules[value].gpu_forward_us += kernel_us
            return
        if kind == "backward":
            path = created_by.get(int(cols.sequence[value]))
            if path is not None:
                modules[path].gpu_backward_us += kernel_us
            return


def _charge_backward(
    cols: Any,
    is_operator: np.ndarray,
    backward_name: np.ndarray,
    created_by: dict[int, str],
    modules: dict[str, _Module],
) -> None:
    """Each backward node's host time (its evaluate_function span) to the module that created it."""
    nodes = np.flatnonzero(is_operator & backward_name[cols.name_code] & (cols.sequence >= 0))
    for index in nodes.tolist():
        path = created_by.get(int(cols.sequence[index]))
        if path is not None:
            modules[path].backward_self_us += float(cols.end[index] - cols.start[index])


def _figures(modules: dict[str, _Module], steps: int) -> list[ModuleTime]:
    backward_total = {path: module.backward_self_us for path, module in modules.items()}
    gpu_backward_total = {path: module.gpu_backward_us for path, module in modules.items()}
    for path, module in modules.items():  # each module's backward into every module around it
        parent, seen = module.parent, {path}
        while parent is not None and parent not in seen:
            backward_total[parent] += module.backward_self_us
            seen.add(parent)
            parent = modules[parent].parent
    times = []
    for path, module in modules.items():
        operators = sorted(module.operators.items(), key=lambda item: -item[1][1])[:TOP_MODULE_OPERATORS]
        times.append(
            ModuleTime(
                path=path,
                calls=module.calls,
                forward_ms=module.forward_us / 1e3 / steps,
                forward_self_ms=max(0.0, module.forward_self_us) / 1e3 / steps,
                backward_ms=backward_total[path] / 1e3 / steps,
                backward_self_ms=module.backward_self_us / 1e3 / steps,
                gpu_forward_ms=module.gpu_forward_us / 1e3 / steps,
                gpu_backward_ms=gpu_backward_total[path] / 1e3 / steps,
                top_operators=[
                    TopOperator(name, int(calls), us / 1e3 / steps) for name, (calls, us) in operators
                ],
            )
        )
    times.sort(key=lambda m: -m.self_ms)
    return times[:TOP_MODULES]
