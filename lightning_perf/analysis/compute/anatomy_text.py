"""The step's anatomy where people read it: one line on the console, a table in the Markdown answer."""

from __future__ import annotations

from lightning_perf.analysis import markdown
from lightning_perf.analysis.compute.anatomy import LOOP, PART_LABELS, CodeTime, StepAnatomy
from lightning_perf.analysis.numbers import fmt1
from lightning_perf.analysis.trace_figures import ModuleTime, TraceFigures

# parts under this share of the step are left off the console line (the table keeps them)
LINE_MIN_PCT = 1.0
# the pieces of user code named beside their part
NAMED_CODE = 3


def _pct(anatomy: StepAnatomy, ms: float) -> str:
    return f"{ms / anatomy.step_ms * 100:.0f}%" if anatomy.step_ms > 0 else "-"


def _code(anatomy: StepAnatomy) -> list[CodeTime]:
    """The callbacks, hooks and loggers that cost the most, lightning-perf's own left out."""
    pieces = [code for code in anatomy.callbacks + anatomy.loggers if code.kind != "lightning_perf"]
    return sorted(pieces, key=lambda code: -code.ms_per_step)[:NAMED_CODE]


def top_hook(code: CodeTime) -> str:
    hook, ms = max(code.hooks_ms.items(), key=lambda item: item[1])
    return f"{code.name}.{hook}"


def anatomy_lines(anatomy: StepAnatomy | None) -> list[str]:
    """``lightning-perf: where the mean step goes (9.4 ms, 80 steps): forward 3.3 ms (35%), ...`` and the
    user's code that costs the most; empty without an anatomy."""
    if anatomy is None or anatomy.step_ms <= 0:
        return []
    parts = [
        f"{PART_LABELS[part]} {fmt1(ms)} ms ({_pct(anatomy, ms)})"
        for part, ms in anatomy.parts_ms.items()
        if ms / anatomy.step_ms * 100 >= LINE_MIN_PCT
    ]
    lines = [
        f"lightning-perf: where the mean step goes ({fmt1(anatomy.step_ms)} ms, {anatomy.steps} steps): "
        + ", ".join(parts)
    ]
    named = [c for c in _code(anatomy) if c.ms_per_step / anatomy.step_ms * 100 >= LINE_MIN_PCT]
    if named:
        lines.append(
            "  of which "
            + ", ".join(
                f"{top_hook(c)} {fmt1(c.ms_per_step)} ms ({_pct(anatomy, c.ms_per_step)})" for c in named
            )
        )
    return lines


def anatomy_markdown(anatomy: StepAnatomy | None) -> str:
    """The anatomy as a Markdown table (every part, then the user's code by cost); "" without one."""
    if anatomy is None or anatomy.step_ms <= 0:
        return ""
    rows = [[PART_LABELS[part], f"{ms:.3f}", _pct(anatomy, ms)] for part, ms in anatomy.parts_ms.items()]
    rows += [
        [markdown.code(top_hook(code)), f"{code.ms_per_step:.3f}", _pct(anatomy, code.ms_per_step)]
        for code in _code(anatomy)
    ]
    lines = [
        "",
        f"### Where the mean step goes ({anatomy.steps} steps, {anatomy.step_ms:.3f} ms; "
        f"{PART_LABELS[LOOP]} is what the hooks leave)",
        "",
    ]
    lines += markdown.table(["Part", "ms a step", "Share"], rows, right_aligned={1, 2})
    return "\n".join(lines) + "\n"


def _module_figures(trace_figures: list[TraceFigures]) -> TraceFigures | None:
    return next((f for f in trace_figures if f.modules), None)


def _steps(figures: TraceFigures) -> str:
    numbers = [n for n in figures.step_numbers if n is not None]
    return f"steps {numbers[0]}-{numbers[-1]}" if numbers else f"{figures.steps} step(s)"


def _module_text(figures: TraceFigures, module: ModuleTime) -> str:
    share = figures.pct_of_step(module.self_ms)
    pct = f" ({share:.0f}%)" if share is not None else ""
    gpu = module.gpu_forward_ms + module.gpu_backward_ms
    gpu_text = f", GPU {gpu:.3f} ms" if gpu else ""
    return (
        f"{module.path} {module.self_ms:.3f} ms{pct}: forward {module.forward_self_ms:.3f}, backward "
        f"{module.backward_self_ms:.3f}{gpu_text}"
    )


def module_lines(trace_figures: list[TraceFigures]) -> list[str]:
    """The costliest modules of the first profiled cycle that named them (self time, forward and backward);
    empty without one."""
    figures = _module_figures(trace_figures)
    if figures is None:
        return []
    lines = [f"lightning-perf: the model's modules in a profiled step ({_steps(figures)}, self time):"]
    lines += [f"  {_module_text(figures, module)}" for module in figures.modules[:NAMED_CODE]]
    return lines


def module_markdown(trace_figures: list[TraceFigures]) -> str:
    figures = _module_figures(trace_figures)
    if figures is None:
        return ""
    rows = [
        [
            markdown.code(m.path),
            str(m.calls),
            f"{m.forward_self_ms:.3f}",
            f"{m.backward_self_ms:.3f}",
            f"{m.forward_ms + m.backward_ms:.3f}",
            f"{m.gpu_forward_ms + m.gpu_backward_ms:.3f}",
        ]
        for m in figures.modules
    ]
    lines = ["", f"### The model's modules in a profiled step ({_steps(figures)}, ms a step)", ""]
    lines += markdown.table(
        ["Module", "Calls", "Forward (self)", "Backward (self)", "Total", "GPU"],
        rows,
        right_aligned={1, 2, 3, 4, 5},
    )
    return "\n".join(lines) + "\n"
