"""The checks of ``gpu_check.py`` about what PerfCallback leaves behind: the A/B's restored state, the memory
timeline, trace cost and cap, the GPU clocks and memory series in the summary, and the case study on the GPU."""

from __future__ import annotations

import copy
import glob
import logging
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from gpu_check_fits import NO_GPU, CheckResult, Context, _traces, cached_fit, fit, result, skipped

from lightning_perf.traces.read.reader import iter_events, rewrite_trace


class Snapshot(L.Callback):
    """The training state after the last step, before PerfCallback's end-of-run A/B (listed before it)."""

    def __init__(self) -> None:
        self.state: dict[str, Any] | None = None

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step >= trainer.max_steps:
            optimizer = trainer.optimizers[0]
            self.state = {
                "benchmark": torch.backends.cudnn.benchmark,
                "grads": [
                    None if p.grad is None else p.grad.detach().clone() for p in pl_module.parameters()
                ],
                "buffers": [b.detach().clone() for b in pl_module.buffers()],
                "optimizer": copy.deepcopy(optimizer.state_dict()),
                "rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state(),
            }


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a.cpu(), b.cpu())
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def check_cudnn_ab_restores(ctx: Context) -> CheckResult:
    name = "cudnn.benchmark A/B restores state"
    if not ctx.gpu:
        return skipped(name, NO_GPU)
    parts, figures = [], {}
    ok = True
    for precision in ("32-true", "bf16-mixed"):
        snap = Snapshot()
        torch.cuda.reset_peak_memory_stats()
        summary, _, trainer = fit(
            ctx, f"ab_{precision}", precision, callbacks=[snap], perf={"enable_profiler": False}
        )
        model, optimizer = trainer.lightning_module, trainer.optimizers[0]
        after = {
            "benchmark": torch.backends.cudnn.benchmark,
            "grads": [None if p.grad is None else p.grad.detach() for p in model.parameters()],
            "buffers": list(model.buffers()),
            "optimizer": optimizer.state_dict(),
            "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(),
        }
        probe = (summary.probes.get("cudnn_benchmark") if summary else None) or {}
        if not probe.get("applies"):
            parts.append(f"{precision}: A/B did not run ({probe.get('reason', 'no probe result')})")
            ok = False
            continue
        changed = [k for k in after if snap.state is None or not _same(snap.state[k], after[k])]
        ok = ok and not changed
        peak = probe.get("peak_mem_bytes")
        memory = (
            f"A/B peak {peak / 1e6:.0f} MB vs training {torch.cuda.max_memory_allocated() / 1e6:.0f} MB"
            if isinstance(peak, (int, float))
            else "peak memory skipped: the A/B records no peak_mem_bytes in this version"
        )
        parts.append(
            f"{precision}: changed {changed or 'nothing'}, speed-up {probe.get('speedup')}, {memory}"
        )
        figures[precision] = {"changed": changed, "speedup": probe.get("speedup"), "peak_mem_bytes": peak}
    return result(name, ok, "; ".join(parts), **figures)


def check_memory_timeline(ctx: Context) -> CheckResult:
    name = "memory timeline"
    perf = {"profile_memory": True, "record_shapes": True, "with_stack": True, "repeat": 1}
    summary, run_dir, _ = fit(ctx, "memory", "32-true", perf=perf)
    pages = glob.glob(os.path.join(run_dir, "*.memory.html"))
    device = f"cuda:{torch.cuda.current_device()}" if ctx.gpu else "cpu"
    if not pages:
        return result(name, False, f"no *.memory.html in the run (expected one for {device})")
    size = os.path.getsize(pages[0])
    return result(name, size > 0, f"{os.path.basename(pages[0])}: {size / 1e3:.0f} kB for {device}")


def check_trace_cost(ctx: Context) -> CheckResult:
    name = "trace cost and cap"
    summary, run_dir = cached_fit(ctx, "fit_32", "32-true")
    recorded = sum(len(t.steps) for t in summary.traces)
    written = sum(t.bytes for t in summary.traces)
    path = _traces(run_dir)[0]
    started = time.perf_counter()
    events = sum(1 for _ in iter_events(path))
    parse_s = time.perf_counter() - started
    started = time.perf_counter()
    rewrite_trace(path, os.path.join(ctx.work, "rewritten.pt.trace.json.gz"), global_rank=0, world_size=1)
    rewrite_s = time.perf_counter() - started
    step = summary.timing.step_time_ms
    stall = f"slowest step {step.max:.1f} ms vs median {step.median:.1f} ms" if step else "no step times"
    # the cap: one cycle's worth of MB, profiling every cycle (repeat=0): later cycles must be skipped
    cap_mb = max(t.bytes for t in summary.traces) / 1e6 * 1.5
    # the cap's warning is a log record of the lightning_perf logger
    records: list[logging.LogRecord] = []
    catcher = logging.Handler(logging.WARNING)
    catcher.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("lightning_perf").addHandler(catcher)
    try:
        capped, _, _ = fit(ctx, "capped", "32-true", perf={"repeat": 0, "max_trace_mb": cap_mb})
    finally:
        logging.getLogger("lightning_perf").removeHandler(catcher)
    capped_bytes = sum(t.bytes for t in capped.traces) if capped else 0
    warned = any("max_trace_mb" in r.getMessage() for r in records)
    ok = capped is not None and capped_bytes <= cap_mb * 1e6 and warned and recorded > 0
    detail = (
        f"{written / max(recorded, 1) / 1e3:.0f} kB per recorded step; parse {parse_s * 1000:.0f} ms and "
        f"rewrite {rewrite_s * 1000:.0f} ms for {events} events; {stall}; cap {cap_mb:.2f} MB with repeat=0: "
        f"{capped_bytes / 1e6:.2f} MB in {len(capped.traces) if capped else 0} traces, "
        f"{'warned' if warned else 'no warning'}"
    )
    return result(name, ok, detail, kb_per_step=written / max(recorded, 1) / 1e3, parse_s=parse_s)


def check_case_study(ctx: Context) -> CheckResult:
    name = "case study on the GPU"
    if not ctx.gpu:
        return skipped(name, NO_GPU + "; tests/test_examples.py runs it on the CPU")
    try:
        from examples import case_study
    except ImportError as err:
        return skipped(name, f"the example cannot be imported ({err}); torchvision is in the examples extra")
    args = case_study.parse_study_args(
        [
            "--accelerator",
            "gpu",
            "--steps",
            "150",
            "--repeats",
            "3",
            # tune drops rounds, then candidates, to fit: the check stays within the GPU check's minutes
            "--budget-s",
            "240",
            "--log-dir",
            os.path.join(ctx.work, "study"),
        ]
    )
    tuned = case_study.run_tune_study(args)
    speed = case_study.after_speed(tuned)
    if speed is None:
        return result(name, False, f"tune measured no candidate: {tuned.decision.line}")
    rows = {}
    for variant in tuned.trial.succeeded if tuned.trial is not None else []:
        if variant.name not in ("baseline", speed.name):
            continue
        s = variant.summary
        gpu = s.utilization.gpu if s else None
        kind = "before" if variant.name == "baseline" else "after"
        rows.setdefault(kind, []).append(
            (variant.mean_step_ms, gpu.kernel_busy_pct if gpu else None, gpu.util_pct if gpu else None)
        )
    text = []
    for kind, values in rows.items():
        med = [
            statistics.median(v[i] for v in values if v[i] is not None)
            if any(v[i] is not None for v in values)
            else None
            for i in range(3)
        ]
        text.append(f"{kind}: mean step {med[0]} ms, kernel-busy {med[1]} %, NVML {med[2]} %")
    detail = f"after: {speed.label}; " + "; ".join(text) + "; " + case_study.verdict_line(speed)
    return result(name, speed.significant, detail, speedup=speed.speedup, low=speed.low, high=speed.high)


def check_clocks_and_memory_series(ctx: Context) -> CheckResult:
    """The summary of a real GPU fit holds the SM clock against its maximum (NVML) and a per-step series of the
    trained device's allocator memory, every reading at most the peak torch recorded, with the device's size."""
    name = "GPU clocks and memory series"
    if not ctx.gpu:
        return skipped(name, NO_GPU)
    summary, _ = cached_fit(ctx, "fit_32", "32-true")
    machine, memory = summary.machine, getattr(summary, "memory", None)
    if memory is None:
        return skipped(name, "no memory series in the summary (the memory_growth part of issue 13)")
    clock = machine.gpu_sm_clock_mhz if machine else None
    top = machine.gpu_sm_clock_max_mhz if machine else None
    gpu_mb = [v for v in memory.gpu_allocated_mb if v is not None]
    peak_mb = memory.gpu_peak_allocated_gb * 1000.0 if memory.gpu_peak_allocated_gb else None
    device_gb = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 1e9
    ok = (
        clock is not None
        and top is not None
        and 0 < clock <= top * 1.01  # a boost clock may read a hair above the listed maximum
        and len(gpu_mb) >= 5
        and peak_mb is not None
        and all(0 < v <= peak_mb * 1.001 for v in gpu_mb)
        and memory.gpu_total_gb is not None
        and abs(memory.gpu_total_gb - device_gb) <= 0.01 * device_gb
    )
    detail = (
        f"SM clock {clock} of {top} MHz, slowdown reasons {machine.gpu_slowdown_pct if machine else None}; "
        f"{len(gpu_mb)} allocator readings {min(gpu_mb, default=None)}-{max(gpu_mb, default=None)} MB, peak "
        f"{peak_mb} MB, device {memory.gpu_total_gb} GB (torch {device_gb:.1f}); findings "
        f"{[f.id for f in summary.findings]}"
    )
    return result(name, ok, detail, sm_clock_mhz=clock, max_sm_clock_mhz=top, readings=len(gpu_mb))


STATE_CHECKS: list[Callable[[Context], CheckResult]] = [
    check_cudnn_ab_restores,
    check_memory_timeline,
    check_trace_cost,
    check_clocks_and_memory_series,
    check_case_study,
]
