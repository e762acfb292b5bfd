"""One command that settles what lightning-perf promises on a GPU: a pass/fail table, in under 5 minutes.

    python benchmarks/gpu_check.py                  # on a machine with one NVIDIA GPU (or: make gpu-check)
    python benchmarks/gpu_check.py --dry-run        # on a CPU: tiny sizes, GPU checks "skipped (no GPU)"

It installs nothing: the project's own install (torch, Lightning, nvidia-ml-py, torchvision for the case
study). The table is printed and, when ``OUT`` is set (or ``--out DIR``), written to ``gpu_check.txt`` and
``gpu_check.json`` there. Checks that rely on a feature not in this version report "skipped: <what is
missing>" instead of failing. The exit code is 1 when a check failed, else 0.

The checks that train (end-to-end fit, sync, timing, data wait, A/B, memory timeline, trace cost, the case
study) live in ``gpu_check_fits.py``; this file holds the runner and the checks of the hardware readers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: lightning_perf, examples

import torch  # noqa: E402
from gpu_check_compute import COMPUTE_CHECKS  # noqa: E402
from gpu_check_fits import FIT_CHECKS, NO_GPU, CheckResult, Context, result, skipped  # noqa: E402
from gpu_check_state import STATE_CHECKS  # noqa: E402

from lightning_perf.collect.sampling.nvml import (  # noqa: E402
    GPU_MEM_USED,
    GPU_UTIL,
    find_device,
    torch_cuda_pci,
    torch_cuda_uuid,
)
from lightning_perf.collect.sampling.utilization import UtilSampler  # noqa: E402

# The brief's lines: ~3 s of bf16 matmuls read >= 90% utilization, ~3 s idle <= 10%.
BUSY_S, IDLE_S = 3.0, 3.0
BUSY_MIN_PCT, IDLE_MAX_PCT = 90.0, 10.0
# the allocation whose NVML memory rise is checked (1 GiB), and the slack of NVML's reading (its own
# bookkeeping, the caching allocator's rounding): 10%
ALLOC_BYTES = 1 << 30
MEM_SLACK = 0.10
# a tiny loop costs "the same within noise" with and without the sampler: medians of 7 runs within 5%
LOOP_RUNS, LOOP_ITERS, LOOP_TOLERANCE = 7, 2000, 0.05
SAMPLER_INTERVAL_S = 0.1


# ----------------------------------------------------------------------------------------- hardware checks


def check_nvml_identity(ctx: Context) -> CheckResult:
    name = "NVML identity"
    if not ctx.gpu:
        return skipped(name, NO_GPU)
    try:
        import pynvml
    except ImportError:
        return skipped(name, "nvidia-ml-py is not installed")
    pynvml.nvmlInit()
    try:
        cuda = torch.cuda.current_device()
        uuid = torch_cuda_uuid(cuda)
        handle = find_device(pynvml, cuda, torch_cuda_uuid, torch_cuda_pci)  # by UUID, as the sampler does
        try:
            index = pynvml.nvmlDeviceGetIndex(handle)
        except pynvml.NVMLError:  # a MIG instance has no node index of its own
            index = None
        nvml_uuid = pynvml.nvmlDeviceGetUUID(handle)
        nvml_uuid = nvml_uuid.decode() if isinstance(nvml_uuid, bytes) else nvml_uuid
        same = nvml_uuid.lower().removeprefix("gpu-") == str(uuid).lower().removeprefix("gpu-")
        mig, denied = [], []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            try:
                current, _pending = pynvml.nvmlDeviceGetMigMode(h)
                mig.append(f"{i}:{'on' if current else 'off'}")
            except pynvml.NVMLError:
                mig.append(f"{i}:n/a")
            try:
                pynvml.nvmlDeviceGetUtilizationRates(h)
            except pynvml.NVMLError as err:
                if getattr(err, "value", None) == pynvml.NVML_ERROR_NO_PERMISSION:
                    denied.append(i)
        detail = (
            f"cuda:{cuda} UUID {uuid} -> NVML {index} ({nvml_uuid}); MIG {' '.join(mig)}; "
            f"NO_PERMISSION devices: {denied or 'none'}"
        )
        return result(name, same, detail, nvml_index=index, mig=mig, no_permission=denied)
    finally:
        pynvml.nvmlShutdown()


def _tiny_loop_s(device: torch.device) -> float:
    x = torch.ones(8, device=device)
    start = time.perf_counter()
    for _ in range(LOOP_ITERS):
        x = x + 1  # host-bound launches: what a sampler thread taking the GIL would slow down
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def check_sampler_truth(ctx: Context) -> CheckResult:
    name = "sampler truth"
    if not ctx.gpu:
        return skipped(name, NO_GPU)
    device = torch.device("cuda", torch.cuda.current_device())
    sampler = UtilSampler(SAMPLER_INTERVAL_S, cuda_devices=[device.index])
    sampler.start()
    try:
        if sampler.gpu_unavailable_reason:
            return skipped(name, f"the sampler reads no GPU: {sampler.gpu_unavailable_reason}")
        sampler.take_window()
        a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        end = time.perf_counter() + BUSY_S
        while time.perf_counter() < end:
            for _ in range(20):
                a @ b
            torch.cuda.synchronize()
        busy = sampler.take_window()
        del a, b
        torch.cuda.empty_cache()
        time.sleep(IDLE_S)
        idle = sampler.take_window()
        block = torch.empty(ALLOC_BYTES, dtype=torch.uint8, device=device)
        torch.cuda.synchronize()
        time.sleep(5 * SAMPLER_INTERVAL_S)
        sampler.take_window()
        time.sleep(5 * SAMPLER_INTERVAL_S)
        held = sampler.take_window()
        del block
        torch.cuda.empty_cache()
        time.sleep(5 * SAMPLER_INTERVAL_S)
        sampler.take_window()
        time.sleep(5 * SAMPLER_INTERVAL_S)
        freed = sampler.take_window()
    finally:
        sampler.stop()
    rise_gb = held.get(GPU_MEM_USED, float("nan")) - freed.get(GPU_MEM_USED, float("nan"))
    alloc_gb = ALLOC_BYTES / 1e9
    with_sampler, without = _loop_medians(device)
    loop_ratio = with_sampler / without
    busy_pct, idle_pct = busy.get(GPU_UTIL, float("nan")), idle.get(GPU_UTIL, float("nan"))
    ok = (
        busy_pct >= BUSY_MIN_PCT
        and idle_pct <= IDLE_MAX_PCT
        and abs(rise_gb - alloc_gb) <= MEM_SLACK * alloc_gb
        and abs(loop_ratio - 1) <= LOOP_TOLERANCE
    )
    detail = (
        f"busy {busy_pct:.0f}% (>= {BUSY_MIN_PCT:.0f}), idle {idle_pct:.0f}% (<= {IDLE_MAX_PCT:.0f}), memory "
        f"+{rise_gb:.2f} GB for {alloc_gb:.2f} GB, tiny loop {loop_ratio:.3f}x with the sampler"
    )
    return result(
        name, ok, detail, busy_pct=busy_pct, idle_pct=idle_pct, mem_rise_gb=rise_gb, loop=loop_ratio
    )


def _loop_medians(device: torch.device) -> tuple[float, float]:
    """Median time of the tiny loop with a sampler running and without, runs interleaved against drift."""
    _tiny_loop_s(device)  # warm-up
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(LOOP_RUNS):
        for on in (True, False):
            sampler = UtilSampler(SAMPLER_INTERVAL_S, cuda_devices=[device.index]) if on else None
            if sampler is not None:
                sampler.start()
            try:
                times[on].append(_tiny_loop_s(device))
            finally:
                if sampler is not None:
                    sampler.stop()
    return statistics.median(times[True]), statistics.median(times[False])


CHECKS: list[Callable[[Context], CheckResult]] = [
    check_nvml_identity,
    check_sampler_truth,
    *FIT_CHECKS,
    *COMPUTE_CHECKS,
    *STATE_CHECKS,
]


# ------------------------------------------------------------------------------------------------- runner


def run_checks(ctx: Context, only: list[str] | None = None) -> list[CheckResult]:
    results = []
    for check in CHECKS:
        if only and not any(word in check.__name__ for word in only):
            continue
        started = time.perf_counter()
        print(f"... {check.__name__}", file=sys.stderr, flush=True)
        try:
            outcome = check(ctx)
        except Exception as err:  # one broken check is a failed row, never a lost table
            tail = traceback.format_exc(limit=-2).strip().splitlines()[-1]
            outcome = CheckResult(
                check.__name__.removeprefix("check_"), "fail", f"{type(err).__name__}: {err} ({tail})"
            )
        outcome.seconds = time.perf_counter() - started
        results.append(outcome)
    return results


def render(results: list[CheckResult], header: str) -> str:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=header, show_lines=False)
    for column in ("check", "result", "s", "detail"):
        table.add_column(column, overflow="fold")
    for r in results:
        table.add_row(r.name, r.status, f"{r.seconds:.1f}", r.detail)
    console = Console(width=160, record=True, file=open(os.devnull, "w"))  # noqa: SIM115  (recorded, not shown)
    console.print(table)
    return console.export_text()


def machine_line(ctx: Context) -> str:
    if ctx.gpu:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return f"{props.name} (compute capability {props.major}.{props.minor}), torch {torch.__version__}"
    return f"CPU only ({'--dry-run' if ctx.dry_run else 'no GPU'}), torch {torch.__version__}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/gpu_check.py", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU (GPU checks skipped)")
    parser.add_argument("--accelerator", choices=("auto", "gpu", "cpu"), default="auto")
    parser.add_argument("--out", default=os.environ.get("OUT"), help="folder for gpu_check.txt/.json ($OUT)")
    parser.add_argument("--only", nargs="*", help="run the checks whose names hold one of these words")
    args = parser.parse_args(argv)
    gpu = torch.cuda.is_available() and args.accelerator != "cpu" and not args.dry_run
    if args.accelerator == "gpu" and not torch.cuda.is_available():
        parser.error("--accelerator gpu: torch sees no CUDA device")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as work:
        ctx = Context(gpu=gpu, dry_run=args.dry_run or not gpu, work=work)
        results = run_checks(ctx, args.only)
    failed = [r for r in results if r.status == "fail"]
    header = f"lightning-perf GPU check: {machine_line(ctx)}; {time.perf_counter() - started:.0f} s"
    text = render(results, header)
    text += f"{len(results) - len(failed)} of {len(results)} checks did not fail ({len(failed)} failed)\n"
    print(text, end="")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        Path(args.out, "gpu_check.txt").write_text(text, encoding="utf-8")
        payload = {"header": header, "checks": [asdict(r) for r in results]}
        Path(args.out, "gpu_check.json").write_text(
            json.dumps(payload, indent=2, default=str), encoding="utf-8"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
