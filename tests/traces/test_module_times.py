"""The module table from a trace's events: forward by the innermost ``nn.Module:`` span, backward by the
autograd sequence number to the module whose forward created the node, GPU kernels by correlation to the launch,
on whichever thread the backward ran."""

from __future__ import annotations

import pytest

from lightning_perf.traces.figures.modules import module_times

MAIN, AUTOGRAD = 1, 2


def span(name, start, dur, tid=MAIN, cat="cpu_op", **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": start, "dur": dur, "pid": 7, "tid": tid, "args": args}


def events(steps: int = 1) -> list[dict]:
    out = []
    for step in range(steps):
        t = step * 1000
        out += [
            span("nn.Module: Net", t, 300, cat="user_annotation"),
            span("nn.Module: encoder", t + 10, 200, cat="user_annotation"),
            span("nn.Module: encoder.0", t + 20, 150, cat="user_annotation"),
            span("aten::linear", t + 30, 100, **{"Sequence number": 10 + step * 10}),
            span("aten::addmm", t + 40, 80, **{"Sequence number": 11 + step * 10}),
            span("cudaLaunchKernel", t + 50, 10, cat="cuda_runtime", correlation=100 + step),
            span("nn.Module: head", t + 220, 50, cat="user_annotation"),
            span("aten::relu", t + 230, 20, **{"Sequence number": 12 + step * 10}),
            # the backward, on the autograd engine's thread, written before the forward's thread in the file
            span(
                "autograd::engine::evaluate_function: AddmmBackward0",
                t + 400,
                120,
                tid=AUTOGRAD,
                **{"Sequence number": 11 + step * 10},
            ),
            span("cudaLaunchKernel", t + 410, 10, tid=AUTOGRAD, cat="cuda_runtime", correlation=200 + step),
            span(
                "autograd::engine::evaluate_function: ReluBackward0",
                t + 530,
                30,
                tid=AUTOGRAD,
                **{"Sequence number": 12 + step * 10},
            ),
            span("kernel_fwd", t + 60, 40, tid=99, cat="kernel", correlation=100 + step),
            span("kernel_bwd", t + 420, 70, tid=99, cat="kernel", correlation=200 + step),
        ]
    autograd = [e for e in out if e["tid"] == AUTOGRAD]
    return autograd + [e for e in out if e["tid"] != AUTOGRAD]


def test_forward_backward_and_kernels_land_on_their_modules():
    modules = {m.path: m for m in module_times(events(steps=2), steps=2)}
    encoder0 = modules["encoder.0"]
    assert encoder0.forward_ms == pytest.approx(0.150)
    assert encoder0.backward_self_ms == pytest.approx(0.120)  # AddmmBackward0: addmm ran in encoder.0
    assert encoder0.gpu_forward_ms == pytest.approx(0.040)
    assert encoder0.gpu_backward_ms == pytest.approx(0.070)
    assert encoder0.top_operators[0].name == "aten::linear"
    assert modules["head"].backward_self_ms == pytest.approx(0.030)
    # self time leaves the submodules out; totals take them in, forward and backward
    assert modules["encoder"].forward_self_ms == pytest.approx(0.050)
    assert modules["encoder"].backward_ms == pytest.approx(0.120)
    assert modules["Net"].forward_ms == pytest.approx(0.300)
    assert modules["Net"].backward_ms == pytest.approx(0.150)
    assert modules["Net"].forward_self_ms == pytest.approx(0.300 - 0.200 - 0.050)
    assert next(iter(modules)) == "encoder.0"  # the costliest self time first


def test_a_trace_without_module_spans_has_no_module_table(realtraces):
    from lightning_perf.traces.read.loader import load_trace
    from lightning_perf.traces.report.build import find_traces

    (path,) = find_traces(str(realtraces / "resnet50_v100_workers0"))
    assert module_times(load_trace(path).spans, steps=3) == []


def test_a_compiled_region_is_one_unit_named_by_its_graph():
    trace = [
        span("Torch-Compiled Region: 0/1", 0, 200),
        span("CompiledFunction", 10, 150, **{"Sequence number": 40}),
        span(
            "autograd::engine::evaluate_function: CompiledFunctionBackward",
            300,
            90,
            **{"Sequence number": 40},
        ),
    ]
    (region,) = module_times(trace, steps=1)
    assert region.path == "Torch-Compiled Region: 0/1" and region.calls == 1
    assert region.forward_ms == pytest.approx(0.200) and region.backward_self_ms == pytest.approx(0.090)
