"""The checks of ``gpu_check.py`` that train: real ``Trainer.fit`` runs of a small conv net with PerfCallback.

Each check takes the shared :class:`Context` and returns a ``CheckResult``; a feature this version does not
have yet is reported as "skipped: <what is missing>".
"""

from __future__ import annotations

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
from lightning_perf.traces.read.reader import iter_events
from lightning_perf.traces.report.build import build_report

NO_GPU = "skipped (no GPU)"
# step time within 5% of CUDA events at batch starts (the brief's line)
EVENTS_TOLERANCE = 0.05
# host data wait vs GPU idle (100 - kernel-busy) when the loader is the bottleneck: within 10 points.
# Our choice: kernel-busy counts launch gaps as idle, a few points on short steps.
IDLE_TOLERANCE_PTS = 10.0
# the kernel-busy figure of the summary and of `report` come from the same traces: equal to 0.5 points
BUSY_TOLERANCE_PTS = 0.5
LOADER_SLEEP_S = 0.02
# training steps only: no profiler cycles and no end-of-run A/B (its explicit syncs are not per-step)
QUIET_END = {"enable_profiler": False, "ab_cudnn_benchmark": False}
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
                    perf=QUIET_END,
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


FIT_CHECKS: list[Callable[[Context], CheckResult]] = [
    check_end_to_end_fit,
    check_no_per_step_sync,
    check_step_time_vs_events,
    check_data_wait_vs_gpu_idle,
]
