"""The GPU figures of one trace section and the cross-rank table, as lines of text for the report."""

from __future__ import annotations

from typing import Any

from lightning_perf.traces.report.ranks import SPREAD_FIGURES


def _f(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:.1f}{unit}"


def figure_lines(trace: dict[str, Any]) -> list[str]:
    """What the GPU did and what the host waited on, one line a topic; empty for a CPU-only trace."""
    fig = trace["figures"]
    if fig["idle_pct"] is None:
        return []
    lines = [
        f"GPU timeline (HTA): idle {_f(fig['idle_pct'], '%')}, compute {_f(fig['compute_pct'], '%')}, "
        f"non-compute {_f(fig['non_compute_pct'], '%')}; over the steps: kernel-busy "
        f"{_f(fig['kernel_busy_pct'], '%')}, compute-only {_f(fig['compute_busy_pct'], '%')}, idle "
        f"{_f(fig['step_idle_pct'], '%')}",
        f"Kernels: {_f(fig['kernels_per_step'])} a step, {_f(fig['kernel_ms_per_step'])} ms, median "
        f"{_f(fig['kernel_median_us'])} us, {_f(fig['small_kernel_count_pct'], '%')} under 10 us "
        f"({_f(fig['small_kernel_time_pct'], '%')} of kernel time); launches {_f(fig['launch_ms_per_step'])} "
        "ms of host time a step",
        f"Communication: {_f(fig['communication_ms_per_step'])} ms a step, "
        f"{_f(fig['exposed_communication_ms_per_step'])} ms of it not overlapped by compute",
    ]
    if fig["blocking"]:
        top = fig["blocking"][0]
        lines.append(
            f"Host-blocking calls: {_f(fig['blocking_ms_per_step'])} ms a step; largest {top['name']} from "
            f"{top['operator']} ({top['calls']} calls, {_f(top['ms_per_step'])} ms a step)"
        )
        lines += [
            f"  {b['name']} from {b['operator']}: {b['calls']} calls, {_f(b['ms_per_step'])} ms a step"
            for b in fig["blocking"][1:5]
        ]
    else:
        lines.append("Host-blocking calls: none inside the steps")
    if fig["memcpy"]:
        copies = ", ".join(f"{m['kind']} {m['calls']}x {_f(m['ms_per_step'])} ms" for m in fig["memcpy"])
        lines.append(f"Copies a step by kind: {copies}")
    lines.append(
        f"Tensor cores: {_f(fig['tensor_core_pct'], '%')} of kernel time; eligible operators "
        f"{_f(fig['tc_eligible_pct'], '%')}, of which without tensor cores {_f(fig['tc_eligible_without_tc_pct'], '%')}"
        + (f" (decided by {fig['tc_decided_by']})" if fig.get("tc_decided_by") else "")
        + (f"; Triton kernels {_f(fig['triton_pct'], '%')}" if fig["triton_pct"] else "")
    )
    if fig["memory_peak_gb"] is not None:
        kind = "peak" if fig["memory_absolute"] else "peak above the first sample"
        growth = (
            f"growth {_f(fig['memory_growth_mb_per_step'])} MB a step"
            if fig["memory_growth_mb_per_step"] is not None
            else "growth not measured: it needs two recorded steps or more"
        )
        lines.append(f"GPU memory: {kind} {_f(fig['memory_peak_gb'])} GB, {growth}")
    return lines


def spread_rows(ranks: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The cross-rank table: one row a rank and a last row with the spread (max - min)."""
    header = ["Rank", *SPREAD_FIGURES.values()]
    rows = [[str(row["rank"]), *(_f(row[k]) for k in SPREAD_FIGURES)] for row in ranks["rows"]]
    rows.append(["spread", *(_f(ranks["spread"][k]) for k in SPREAD_FIGURES)])
    return header, rows
