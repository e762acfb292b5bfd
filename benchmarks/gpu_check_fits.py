"""The checks of ``gpu_check.py`` that train: real ``Trainer.fit`` runs of a small conv net with PerfCallback.

Each check takes the shared :class:`Context` and returns a ``CheckResult``; a feature this version does not
have yet is reported as "skipped: <what is missing>".
"""

from __future__ import annotations

import copy
import glob
import os
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from lightning_perf import PerfCallback
from lightning_perf.analysis.summary import RunSummary
from lightning_perf.traces.reader import iter_events, rewrite_trace
from lightning_perf.traces.report import build_report

NO_GPU = "skipped (no GPU)"
# step time within 5% of CUDA events at batch starts (the brief's line)
EVENTS_TOLERANCE = 0.05
# host data wait vs GPU idle (100 - kernel-busy) when the loader is the bottleneck: within 10 points.
# Our choice: kernel-busy counts launch gaps as idle, a few points on short steps.
IDLE_TOLERANCE_PTS = 10.0
# the kernel-busy figure of the summary and of `report` come from the same traces: equal to 0.5 points
BUSY_TOLERANCE_PTS = 0.5
LOADER_SLEEP_S = 0.02
PROFILE = dict(skip_first=2, wait=1, warmup=1, active=3, repeat=2)  # two traces within 12 steps


@dataclass
class Sizes:
    steps: int
    batch: int
    image: int
    width: int


@dataclass
class Context:
    """What the checks share: the mode, a scratch folder, and runs already made (reused, not refitted)."""

    gpu: bool
    dry_run: bool
    work: str
    runs: dict[str, tuple[RunSummary, str]] = field(default_factory=dict)

    @property
    def sizes(self) -> Sizes:
        return Sizes(40, 256, 64, 64) if self.gpu else Sizes(14, 8, 16, 8)

    @property
    def accelerator(self) -> str:
        return "gpu" if self.gpu else "cpu"


class ConvNet(L.LightningModule):
    """Three 3x3 convolutions, global pooling and a linear layer; logs nothing per step (no `.item()`)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10),
        )  # fmt: skip

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images, labels = batch
        return F.cross_entropy(self.net(images), labels)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


class SleepyBatches(IterableDataset):
    """Whole batches after a sleep each: a loader the GPU always waits for (the CPU runs ahead otherwise)."""

    def __init__(self, batch: tuple[torch.Tensor, torch.Tensor], sleep_s: float, count: int) -> None:
        self.batch, self.sleep_s, self.count = batch, sleep_s, count

    def __iter__(self):
        for _ in range(self.count):
            time.sleep(self.sleep_s)
            yield self.batch


def _data(ctx: Context, sleep_s: float | None = None) -> DataLoader:
    s = ctx.sizes
    images, labels = torch.randn(s.batch * 4, 3, s.image, s.image), torch.randint(0, 10, (s.batch * 4,))
    if sleep_s is None:
        return DataLoader(TensorDataset(images, labels), batch_size=s.batch, shuffle=True, drop_last=True)
    return DataLoader(SleepyBatches((images[: s.batch], labels[: s.batch]), sleep_s, 10_000), batch_size=None)


def fit(
    ctx: Context,
    name: str,
    precision: str = "32-true",
    perf: dict[str, Any] | None = None,
    callbacks: list[Any] | None = None,
    data: DataLoader | None = None,
    with_perf: bool = True,
) -> tuple[RunSummary | None, str, L.Trainer]:
    """Fit the conv net ``ctx.sizes.steps`` steps; the run is ``<work>/<name>`` (a TensorBoard run)."""
    L.seed_everything(0, verbose=False)
    perf_cb = PerfCallback(**{**PROFILE, "probe_num_workers": "never", **(perf or {})}) if with_perf else None
    logger = TensorBoardLogger(ctx.work, name="", version=name)
    trainer = L.Trainer(
        accelerator=ctx.accelerator,
        devices=1,
        precision=precision,
        max_steps=ctx.sizes.steps,
        logger=logger,
        callbacks=[*(callbacks or []), *([perf_cb] if perf_cb else [])],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=10_000,
    )
    trainer.fit(ConvNet(ctx.sizes.width), train_dataloaders=data if data is not None else _data(ctx))
    summary = perf_cb.last_summary if perf_cb else None
    return summary, logger.log_dir, trainer


def cached_fit(ctx: Context, name: str, precision: str) -> tuple[RunSummary, str]:
    if name not in ctx.runs:
        summary, run_dir, _ = fit(ctx, name, precision)
        if summary is None:
            raise RuntimeError(f"the {name} fit left no summary")
        ctx.runs[name] = (summary, run_dir)
    return ctx.runs[name]


@dataclass
class CheckResult:
    name: str
    status: str  # "pass", "fail", "skipped (...)" / "skipped: ..."
    detail: str
    seconds: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)


def result(name: str, ok: bool, detail: str, **figures: Any) -> CheckResult:
    return CheckResult(name, "pass" if ok else "fail", detail, figures=figures)


def skipped(name: str, why: str) -> CheckResult:
    return CheckResult(name, why if why.startswith("skipped") else f"skipped: {why}", "")


def _traces(run_dir: str) -> list[str]:
    return sorted(glob.glob(os.path.join(run_dir, "*.pt.trace.json*")))


# ---------------------------------------------------------------------------------------------- the checks


def check_end_to_end_fit(ctx: Context) -> CheckResult:
    name = "end-to-end fit"
    summary, run_dir = cached_fit(ctx, "fit_32", "32-true")
    traces = _traces(run_dir)
    ok = summary.status == "finished" and summary.timing.steps > 0 and len(traces) == PROFILE["repeat"]
    detail = f"{summary.timing.steps} steps timed, {len(traces)} traces"
    if not ctx.gpu:
        return result(name, ok, detail + "; kernel, compute-capability and precision checks skipped (no GPU)")
    kernels = sum(1 for path in traces for e in iter_events(path) if e.get("cat") == "kernel")
    gpu = summary.utilization.gpu
    busy = gpu.kernel_busy_pct if gpu else None
    report = [
        t["kernel_busy_pct"] for t in build_report(run_dir)["traces"] if t["kernel_busy_pct"] is not None
    ]
    report_busy = statistics.fmean(report) if report else None
    cc = list(torch.cuda.get_device_capability())
    bf16, _ = cached_fit(ctx, "fit_bf16", "bf16-mixed")
    fp32_ids, bf16_ids = {f.id for f in summary.findings}, {f.id for f in bf16.findings}
    wants_mp = cc[0] >= 7  # tensor cores (thresholds.TENSOR_CORE_MIN_CC)
    ok = (
        ok
        and kernels > 0
        and busy is not None
        and report_busy is not None
        and abs(busy - report_busy) <= BUSY_TOLERANCE_PTS
        and gpu is not None
        and gpu.compute_capability == cc
        and ("mixed_precision" in fp32_ids) == wants_mp
        and "mixed_precision" not in bf16_ids
    )
    detail += (
        f", {kernels} kernel events; kernel-busy {busy} % (summary) vs {report_busy} % (report); compute "
        f"capability {gpu.compute_capability if gpu else None} (torch {cc}); mixed_precision finding: "
        f"32-true {'yes' if 'mixed_precision' in fp32_ids else 'no'}, bf16-mixed "
        f"{'yes' if 'mixed_precision' in bf16_ids else 'no'}"
    )
    return result(name, ok, detail, kernel_busy_pct=busy, report_kernel_busy_pct=report_busy)


def check_no_per_step_sync(ctx: Context) -> CheckResult:
    name = "no per-step sync"
    if not ctx.gpu:
        return skipped(name, NO_GPU)
    counts = {}
    for with_perf in (False, True):
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                fit(
                    ctx,
                    f"sync_{with_perf}",
                    "bf16-mixed",
                    with_perf=with_perf,
                    perf={"enable_profiler": False},
                )
        finally:
            torch.cuda.set_sync_debug_mode("default")
        counts[with_perf] = sum("synchroniz" in str(w.message) for w in caught)
    detail = f"synchronizing calls warned: {counts[False]} without PerfCallback, {counts[True]} with it"
    return result(
        name, counts[True] == counts[False], detail, without=counts[False], with_callback=counts[True]
    )


class BatchStartEvents(L.Callback):
    """A CUDA event recorded at every batch start: the device's own clock of the step period."""

    def __init__(self) -> None:
        self.events: list[torch.cuda.Event] = []

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self.events.append(event)


def check_step_time_vs_events(ctx: Context) -> CheckResult:
    name = "step time vs CUDA events"
    if not ctx.gpu:
        return skipped(name, NO_GPU)
    events = BatchStartEvents()
    summary, _, _ = fit(ctx, "events", "32-true", callbacks=[events], perf={"enable_profiler": False})
    torch.cuda.synchronize()
    gaps = [a.elapsed_time(b) for a, b in zip(events.events[1:], events.events[2:], strict=False)]
    device_ms = statistics.median(gaps)
    host_ms = summary.timing.step_time_ms.median if summary and summary.timing.step_time_ms else float("nan")
    off = abs(host_ms - device_ms) / device_ms
    detail = (
        f"median step {host_ms:.2f} ms (PerfCallback) vs {device_ms:.2f} ms (CUDA events), {off:.1%} apart"
    )
    return result(name, off <= EVENTS_TOLERANCE, detail, host_ms=host_ms, device_ms=device_ms)


def check_data_wait_vs_gpu_idle(ctx: Context) -> CheckResult:
    name = "data wait vs GPU idle"
    if not ctx.gpu:
        return skipped(name, NO_GPU)
    summary, run_dir, _ = fit(ctx, "sleepy", "bf16-mixed", data=_data(ctx, sleep_s=LOADER_SLEEP_S))
    wait = summary.timing.data_wait_pct if summary else None
    gpu = summary.utilization.gpu if summary else None
    busy = gpu.kernel_busy_pct if gpu else None
    if wait is None or busy is None:
        return result(name, False, f"data wait {wait} %, kernel-busy {busy} %: not measured")
    idle = 100.0 - busy
    ok = abs(wait - idle) <= IDLE_TOLERANCE_PTS
    detail = f"host data wait {wait:.1f}% vs GPU idle {idle:.1f}% (100 - kernel-busy)"
    device_wait = getattr(summary.timing, "gpu_idle_pct", None)  # GPU-side wait by CUDA events, if present
    if device_wait is None:
        detail += "; GPU-side data wait skipped: RunSummary.timing has no gpu_idle_pct in this version"
    else:
        ok = ok and abs(device_wait - idle) <= IDLE_TOLERANCE_PTS
        detail += f"; GPU-side wait by events {device_wait:.1f}%"
    return result(name, ok, detail, data_wait_pct=wait, gpu_idle_pct=idle, device_wait_pct=device_wait)


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
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        capped, _, _ = fit(ctx, "capped", "32-true", perf={"repeat": 0, "max_trace_mb": cap_mb})
    capped_bytes = sum(t.bytes for t in capped.traces) if capped else 0
    warned = any("max_trace_mb" in str(w.message) for w in caught)
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
            "--log-dir",
            os.path.join(ctx.work, "study"),
        ]
    )
    _, plan = case_study.diagnose_and_plan(args)
    if not plan.applied:
        return result(name, False, "the diagnosis asked for no change the example applies")
    trial = case_study.measure(args, plan)
    change = case_study.after_change(trial)
    if change is None:
        return skipped(name, "run_trial gives no comparison.changes (the repeated measurement of issue 16)")
    rows = {}
    for variant in trial.succeeded:
        s = variant.summary
        gpu = s.utilization.gpu if s else None
        kind = "after" if variant.name.startswith("after") else "before"
        rows.setdefault(kind, []).append(
            (variant.median_step_ms, gpu.kernel_busy_pct if gpu else None, gpu.util_pct if gpu else None)
        )
    text = []
    for kind, values in rows.items():
        med = [
            statistics.median(v[i] for v in values if v[i] is not None)
            if any(v[i] is not None for v in values)
            else None
            for i in range(3)
        ]
        text.append(f"{kind}: step {med[0]} ms, kernel-busy {med[1]} %, NVML {med[2]} %")
    applied = ", ".join(f"{d.key}={d.value!r}" for d in plan.applied)
    detail = f"applied {applied}; " + "; ".join(text) + "; " + case_study.verdict_line(change)
    return result(
        name, change.verdict == "faster", detail, ratio=change.ratio, low=change.low, high=change.high
    )


FIT_CHECKS: list[Callable[[Context], CheckResult]] = [
    check_end_to_end_fit,
    check_no_per_step_sync,
    check_step_time_vs_events,
    check_data_wait_vs_gpu_idle,
    check_cudnn_ab_restores,
    check_memory_timeline,
    check_trace_cost,
    check_case_study,
]
