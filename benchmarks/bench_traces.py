"""Trace parsing and rewrite cost on a large synthetic trace, in one process.

Generates a synthetic but realistic torch.profiler GPU training trace (kineto's layout and formatting:
ProfilerStep#, DataLoader spans, nested cpu_op / python_function events, cuda_runtime launches correlated
with kernels, memcpy / memset on a GPU stream, flow and instant events) of about ``--mb`` MB uncompressed,
gzipped, then measures:

- report parsing: ``lightning_perf.traces.report.build.analyse_trace`` (streaming parse + step breakdown + operator and
  kernel tables + kernel-busy), wall time, and peak memory two ways: the tracemalloc peak of Python
  allocations (a second run; tracemalloc slows it down) and the growth of the process's max RSS
  (``resource.getrusage``; the generator streams, so the parse sets the high-water mark);
- the streaming reader alone (iterating every event), time and tracemalloc peak;
- ``rewrite_trace`` throughput in MB/s of uncompressed trace, to .json.gz and to plain .json.

Usage: python benchmarks/bench_traces.py [--mb 100] [--keep DIR]
"""

from __future__ import annotations

import argparse
import gzip
import os
import random
import resource
import shutil
import tempfile
import time
import tracemalloc
from typing import IO

from lightning_perf.traces.read import reader as traces
from lightning_perf.traces.report.build import analyse_trace

PID, MAIN_TID, BACKWARD_TID = 4242, 4242, 4301
GPU_PID, STREAM = 0, 7
T0 = 5356167752000.0  # kineto timestamps: microseconds of the monotonic clock, with ns decimals

_X = """  {{
    "ph": "X", "cat": "{cat}", "name": "{name}", "pid": {pid}, "tid": {tid},
    "ts": {ts:.3f}, "dur": {dur:.3f},
    "args": {{
      {args}
    }}
  }}"""
_FLOW = """  {{
    "ph": "{ph}", "id": {id}, "pid": {pid}, "tid": {tid}, "ts": {ts:.3f},
    "cat": "ac2g", "name": "ac2g"{bp}
  }}"""
_MEMORY = """  {{
    "ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
    "pid": {pid}, "tid": {tid},
    "ts": {ts:.3f},
    "args": {{
      "Total Reserved": 1073741824, "Total Allocated": {alloc}, "Bytes": {bytes}, "Addr": 139812345{addr}, "Device Id": 0, "Device Type": 1, "Ev Idx": {idx}
    }}
  }}"""
_OP_ARGS = (
    '"External id": {ext},"Record function id": 0, "Sequence number": {seq}, "Fwd thread id": 0, '
    '"Concrete Inputs": ["", "", "", "", ""], "Input type": ["float", "float", "float", "Scalar", "Scalar"], '
    '"Input Strides": [[1], [1024, 1], [1, 1024], [], []], '
    '"Input Dims": [[1024], [256, 1024], [1024, 1024], [], []], "Ev Idx": {idx}'
)
_KERNEL_ARGS = (
    '"External id": {ext}, "queued": 0, "device": 0, "context": 1, "stream": 7, "correlation": {corr}, '
    '"registers per thread": 128, "shared memory": 16384, "blocks per SM": 2.4, "warps per SM": 9.6, '
    '"grid": [8, 32, 1], "block": [256, 1, 1], "est. achieved occupancy %": 19'
)
KERNELS = (
    "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_16x4_tn_align4>(cutlass_80_tensorop_s1688gemm"
    "_128x128_16x4_tn_align4::Params)",
    "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::launch_clamp_scalar"
    "(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::"
    "operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >(int, "
    "at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar,"
    " at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::"
    "{lambda(float)#1}, std::array<char*, 2ul>)",
    "ampere_sgemm_128x64_nn",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
    "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>"
    ", unsigned int, float, 4, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native"
    "::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned"
    " int, float, 4, 4>)",
)


class _Writer:
    """Streams events to a gzip file, counting uncompressed bytes; never holds the trace in memory."""

    def __init__(self, fh: IO[str]) -> None:
        self.fh = fh
        self.bytes = 0
        self.count = 0
        self.first = True
        self.ext = self.corr = self.idx = 0

    def raw(self, text: str) -> None:
        self.fh.write(text)
        self.bytes += len(text)

    def event(self, text: str) -> None:
        self.raw(text if self.first else ",\n" + text)
        self.first = False
        self.count += 1

    def op(self, cat: str, name: str, ts: float, dur: float, tid: int = MAIN_TID) -> int:
        self.ext += 1
        self.idx += 1
        args = _OP_ARGS.format(ext=self.ext, seq=self.ext % 977, idx=self.idx)
        self.event(_X.format(cat=cat, name=name, pid=PID, tid=tid, ts=ts, dur=dur, args=args))
        return self.ext

    def python(self, name: str, ts: float, dur: float, tid: int = MAIN_TID) -> None:
        self.idx += 1
        args = f'"Python parent id": {self.idx - 1}, "Python id": {self.idx}, "Ev Idx": {self.idx}'
        self.event(_X.format(cat="python_function", name=name, pid=PID, tid=tid, ts=ts, dur=dur, args=args))

    def launch(
        self, ext: int, cat: str, name: str, ts: float, gpu_ts: float, gpu_dur: float, tid: int
    ) -> None:
        """A cuda_runtime call inside op ``ext`` and the GPU activity it launches (with its flow arrow)."""
        self.corr += 1
        runtime = {
            "kernel": "cudaLaunchKernel",
            "gpu_memcpy": "cudaMemcpyAsync",
            "gpu_memset": "cudaMemsetAsync",
        }
        args = f'"External id": {ext}, "cbid": 211, "correlation": {self.corr}'
        self.event(
            _X.format(cat="cuda_runtime", name=runtime[cat], pid=PID, tid=tid, ts=ts, dur=4.1, args=args)
        )
        self.event(_FLOW.format(ph="s", id=self.corr, pid=PID, tid=tid, ts=ts, bp=""))
        args = _KERNEL_ARGS.format(ext=ext, corr=self.corr)
        self.event(_X.format(cat=cat, name=name, pid=GPU_PID, tid=STREAM, ts=gpu_ts, dur=gpu_dur, args=args))
        self.event(_FLOW.format(ph="f", id=self.corr, pid=GPU_PID, tid=STREAM, ts=gpu_ts, bp=', "bp": "e"'))

    def memory(self, ts: float) -> None:
        self.idx += 1
        self.event(
            _MEMORY.format(
                pid=PID, tid=MAIN_TID, ts=ts, alloc=5 << 20, bytes=4096, addr=self.idx, idx=self.idx
            )
        )


def _step(w: _Writer, number: int, t: float, gpu_t: float, rng: random.Random) -> tuple[float, float]:
    """One training step: DataLoader, H2D copy, forward, backward (autograd thread), optimizer.
    Returns the host and GPU clocks at its end."""
    start = t
    # (kind, ...) items, emitted after the step span: kineto writes a parent before its children.
    # ("op" | "py", cat, name, ts, dur, tid), ("launch", cat, name, ts, gpu_ts, dur, tid); a launch belongs
    # to the op emitted just before it.
    items: list[tuple] = []
    dl = rng.uniform(800, 3000)
    items.append(
        (
            "op",
            "user_annotation",
            "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
            t + 5,
            dl,
            MAIN_TID,
        )
    )
    for i in range(12):
        items.append(
            (
                "py",
                "python_function",
                f"torch/utils/data/dataloader.py({700 + i}): _next_data",
                t + 10 + i * dl / 13,
                dl / 15,
                MAIN_TID,
            )
        )
    t += dl + 10
    items.append(("op", "cpu_op", "aten::to", t, 40.0, MAIN_TID))
    gpu_start = first_gpu = max(gpu_t, t + 25)
    items.append(
        ("launch", "gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", t + 20, gpu_start, 180.0, MAIN_TID)
    )
    gpu_t = gpu_start + 180.0
    t += 45
    phases = (
        (
            MAIN_TID,
            ("py", "nn.Module: Linear_{}"),
            ("py", "torch/nn/modules/linear.py(125): forward"),
            ("aten::linear", "aten::relu"),
        ),
        (
            BACKWARD_TID,
            ("op", "autograd::engine::evaluate_function: AddmmBackward0"),
            ("op", "AddmmBackward0"),
            ("aten::mm", "aten::threshold_backward"),
        ),
    )
    for tid, outer, inner, leaves in phases:
        for layer in range(40):
            for (kind, name), offset, dur in ((outer, 0, 60.0), (inner, 2, 55.0)):
                name = name.format(layer)
                items.append(
                    (kind, "python_function" if kind == "py" else "cpu_op", name, t + offset, dur, tid)
                )
            for j, leaf in enumerate(leaves):
                op_t = t + 5 + j * 26
                items.append(("op", "cpu_op", leaf, op_t, 24.0, tid))
                dur = rng.uniform(20, 300)
                gpu_start = max(gpu_t, op_t + 15)
                items.append(
                    ("launch", "kernel", KERNELS[(layer + j) % len(KERNELS)], op_t + 10, gpu_start, dur, tid)
                )
                gpu_t = gpu_start + dur
            t += 62
    items.append(("op", "user_annotation", "Optimizer.step#AdamW.step", t, 400.0, MAIN_TID))
    items.append(("op", "cpu_op", "aten::_foreach_add_", t + 10, 300.0, MAIN_TID))
    gpu_start = max(gpu_t, t + 30)
    items.append(("launch", "gpu_memset", "Memset (Device)", t + 20, gpu_start, 25.0, MAIN_TID))
    gpu_t = gpu_start + 25.0
    t += 430
    w.op("user_annotation", f"ProfilerStep#{number}", start, t - start)
    for item in items:
        if item[0] == "op":
            w.op(*item[1:])
        elif item[0] == "py":
            w.python(*item[2:])
        else:
            w.launch(w.ext, *item[1:])
        if w.count % 50 == 0:
            w.memory(item[3])
    # torch mirrors the step onto the GPU stream, from its first to its last GPU activity
    args = '"External id": 1'
    w.event(
        _X.format(
            cat="gpu_user_annotation",
            name=f"ProfilerStep#{number}",
            pid=GPU_PID,
            tid=STREAM,
            ts=first_gpu,
            dur=gpu_t - first_gpu,
            args=args,
        )
    )
    return t, gpu_t


def generate(path: str, target_mb: float, seed: int = 0) -> tuple[int, int, int]:
    """Write the synthetic trace; returns (uncompressed bytes, events, steps)."""
    rng = random.Random(seed)
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=6) as fh:
        w = _Writer(fh)
        w.raw(
            '{\n  "schemaVersion": 1,\n  "deviceProperties": [\n    {\n      "id": 0, "name": "NVIDIA H100 80GB '
            'HBM3", "totalGlobalMem": 84942979072,\n      "computeMajor": 9, "computeMinor": 0\n    }\n  ],\n'
            '  "record_shapes": 1,\n  "with_stack": 1,\n  "displayTimeUnit": "ms",\n'
            '  "baseTimeNanoseconds": 1790857026000000000,\n  "traceEvents": [\n'
        )
        for tid, label in ((MAIN_TID, "thread 4242 (python)"), (BACKWARD_TID, "thread 4301 (pt_autograd_0)")):
            w.event(
                f'  {{\n    "name": "thread_name", "ph": "M", "ts": {T0:.3f}, "pid": {PID}, "tid": {tid},\n'
                f'    "args": {{\n      "name": "{label}"\n    }}\n  }}'
            )
        t, gpu_t, steps = T0 + 100, T0 + 100, 0
        while w.bytes < target_mb * 1e6:
            t, gpu_t = _step(w, steps + 1, t, gpu_t, rng)
            t = max(t, gpu_t - 2000)  # the host runs at most ~2 ms ahead of the GPU
            steps += 1
        w.raw(f'\n  ],\n  "traceName": "{path}"\n}}\n')
    return w.bytes, w.count, steps


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _traced_peak_mb(fn) -> float:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0, help="uncompressed trace size in MB (default 100)")
    parser.add_argument("--keep", metavar="DIR", help="write the files here and keep them")
    args = parser.parse_args()
    workdir = args.keep or tempfile.mkdtemp(prefix="bench_traces_")
    os.makedirs(workdir, exist_ok=True)
    src = os.path.join(workdir, "bench_rank0.1.pt.trace.json.gz")
    try:
        t = time.perf_counter()
        size, events, steps = generate(src, args.mb)
        gen_s = time.perf_counter() - t
        mb = size / 1e6
        print(
            f"synthetic trace: {mb:.1f} MB uncompressed, {os.path.getsize(src) / 1e6:.1f} MB gzipped, "
            f"{events} events, {steps} steps (generated in {gen_s:.1f} s)"
        )

        rss_before = _maxrss_mb()
        t = time.perf_counter()
        section = analyse_trace(src)
        parse_s = time.perf_counter() - t
        rss_growth = _maxrss_mb() - rss_before
        peak = _traced_peak_mb(lambda: analyse_trace(src))
        print(
            f"report parsing (analyse_trace): {parse_s:.2f} s = {mb / parse_s:.1f} MB/s; "
            f"peak memory: tracemalloc peak {peak:.0f} MB, max RSS growth {rss_growth:.0f} MB "
            f"({section['average']['steps']} steps, kernel-busy {section['kernel_busy_pct']}%)"
        )

        def read_all() -> int:
            return sum(1 for _ in traces.iter_events(src))

        t = time.perf_counter()
        read_all()
        read_s = time.perf_counter() - t
        print(
            f"streaming reader alone: {read_s:.2f} s = {mb / read_s:.1f} MB/s; "
            f"tracemalloc peak {_traced_peak_mb(read_all):.1f} MB"
        )

        for suffix in (".json.gz", ".json"):
            dst = os.path.join(workdir, "rewritten.pt.trace" + suffix)
            t = time.perf_counter()
            written = traces.rewrite_trace(src, dst, global_rank=0, world_size=1)
            rewrite_s = time.perf_counter() - t
            level = f" (gzip level {traces.REWRITE_GZIP_LEVEL})" if suffix.endswith(".gz") else ""
            print(
                f"rewrite_trace to {suffix}{level}: {rewrite_s:.2f} s = {mb / rewrite_s:.1f} MB/s of "
                f"uncompressed trace, {written / 1e6:.1f} MB written"
            )
        assert sum(1 for _ in traces.iter_events(dst)) == events, "the rewrite lost events"
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
