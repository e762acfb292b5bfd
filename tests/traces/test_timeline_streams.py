"""The GPU timeline on overlapping streams (issue 47): compute, non-compute and idle over the profiled steps equal an
independent recomputation from the raw events, on hand-made communication-heavy traces and on generated ones
(several streams, collectives, copies, work no call launched) against a brute-force interval union on a
microsecond grid."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from lightning_perf.traces.figures.gpu_figures import trace_figures
from lightning_perf.traces.figures.gpu_timeline import gpu_timeline
from lightning_perf.traces.read.columns import host_steps
from lightning_perf.traces.read.loader import load_trace

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
NCCL = "ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)"


def x(name, cat, ts, dur, pid=1, tid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def gpu(name, ts, dur, stream=7, cat="kernel", **args):
    return x(name, cat, ts, dur, pid=0, tid=stream, **args)


def load(tmp_path, events, name="t_rank0.1.pt.trace.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return load_trace(path)


def communication_heavy():
    """Three steps of 1000 us on an MI300X-like trace: the compute kernels have no launching call in the trace (as
    on ROCm, where a third of the activities have none), the RCCL all-reduces do. Step 2's all-reduces run into the
    last step, [1900, 2200] and [2300, 2900], while the last step's own compute kernels run on stream 7."""
    events = []
    for n in range(3):
        base = 1000 * n
        events += [x(f"ProfilerStep#{n + 1}", "user_annotation", base, 1000)]
        events += [gpu("Cijk_Alik_Bljk_BBS_BH_MT128x128x64_MI16x16x1", base + t, 300) for t in (100, 500)]
    events = [e for e in events if not (e["ts"] in (2100, 2500) and e["cat"] == "kernel")]
    events += [
        gpu("Cijk_Alik_Bljk_BBS_BH_MT128x128x64_MI16x16x1", 2150, 200),  # the last step's
        gpu("Cijk_Alik_Bljk_BBS_BH_MT128x128x64_MI16x16x1", 2400, 200),
        x("hipLaunchKernel", "cuda_runtime", 850, 5, correlation=1),
        gpu(NCCL, 900, 100, stream=20, correlation=1),
        x("hipLaunchKernel", "cuda_runtime", 1850, 5, correlation=2),
        gpu(NCCL, 1900, 300, stream=20, correlation=2),
        x("hipLaunchKernel", "cuda_runtime", 1860, 5, correlation=3),
        gpu(NCCL, 2300, 600, stream=20, correlation=3),
        x("hipLaunchKernel", "cuda_runtime", 2850, 5, correlation=4),  # the last step's: out, as HTA
        gpu(NCCL, 2950, 40, stream=20, correlation=4),
    ]
    return events


def test_a_long_collective_does_not_bring_the_last_steps_kernels_in(tmp_path):
    """The steps' work: compute [100,400] [500,800] [1100,1400] [1500,1800], RCCL [900,1000] [1900,2200]
    [2300,2900]: window [100, 2900] = 2800 us, busy 2200, compute 1200. The last step's kernels at 2150 and 2400
    started while step 2's all-reduce ran, but on another stream and after the last step began: counting them
    filled the gap [2200, 2300] and added 400 us of compute (idle 17.9%, compute 57.1%)."""
    events = communication_heavy()
    for trace in (load(tmp_path, events).spans, events):
        timeline = gpu_timeline(trace, host_steps(trace))
        assert (timeline.window_us, timeline.idle_us, timeline.compute_us) == (2800, 600, 1200)
        assert timeline.communication_us == 1000
        assert timeline.idle_pct == pytest.approx(100 * 600 / 2800)
        assert timeline.compute_pct == pytest.approx(100 * 1200 / 2800)
        assert timeline.non_compute_pct == pytest.approx(100 * 1000 / 2800)


def test_work_without_a_call_before_launched_work_on_its_stream_is_the_steps(tmp_path):
    """A stream runs its work in launch order: a kernel with no call that starts on stream 9 before a kernel step 2
    launched (which the GPU ran late, after the last step began) was launched in the steps too."""
    events = communication_heavy() + [
        gpu("Cijk_Alik_Bljk_BBS_BH_MT128x128x64_MI16x16x1", 2920, 30, stream=9),  # no call, before the next
        x("hipLaunchKernel", "cuda_runtime", 1870, 5, correlation=5),
        gpu("Cijk_Alik_Bljk_BBS_BH_MT128x128x64_MI16x16x1", 2960, 20, stream=9, correlation=5),
    ]
    timeline = gpu_timeline(events, host_steps(events))
    assert timeline.window_us == 2880  # [100, 2980]
    assert timeline.compute_us == 1200 + 30 + 20
    assert timeline.idle_us == 600 + 20 + 10  # and [2900, 2920], [2950, 2960]


# ---------------------------------------------------------------------------------------------------------
# Generated traces against a brute-force recomputation
# ---------------------------------------------------------------------------------------------------------


def generated(rng: random.Random) -> list[dict]:
    """Steps of 200-2000 us; in each, launches of kernels, collectives and copies onto 1-4 streams, starting
    late (the GPU lags) and overlapping one another; kernels no call launched (no id, or an id no call has)
    anywhere; work left over from before profiling (ids below every call of the steps)."""
    events, t, corr = [], 0, 100
    streams = rng.sample([7, 9, 13, 20], rng.randint(1, 4))
    for n in range(rng.randint(2, 5)):
        length = rng.randint(200, 2000)
        events.append(x(f"ProfilerStep#{n}", "user_annotation", t, length))
        for _ in range(rng.randint(0, 8)):
            corr += 1
            at = t + rng.randint(0, length - 1)
            events.append(x("cudaLaunchKernel", "cuda_runtime", at, rng.randint(1, 10), correlation=corr))
            name, cat = rng.choice([("sgemm", "kernel"), (NCCL, "kernel"), ("Memcpy DtoD", "gpu_memcpy"),
                                    ("Memset", "gpu_memset"), ("igemm_fwd_gtcx3_nhwc_bf16", "kernel")])  # fmt: skip
            long = rng.random() < 0.2
            dur = rng.randint(0, 3 * length if long else 300)
            events.append(
                gpu(name, at + rng.randint(0, 400), dur, rng.choice(streams), cat, correlation=corr)
            )
        for _ in range(rng.randint(0, 4)):  # no launching call in the trace
            ids = rng.choice([{}, {"correlation": 10**6 + rng.randint(0, 10**5)}])
            events.append(gpu("triton_poi_fused_add_0", t + rng.randint(-100, length + 300), rng.randint(0, 300),
                              rng.choice(streams), **ids))  # fmt: skip
        t += length
    for _ in range(rng.randint(0, 2)):  # launched before profiling began
        events.append(gpu("sgemm", rng.randint(-500, 300), rng.randint(0, 600), rng.choice(streams),
                          correlation=rng.randint(1, 99)))  # fmt: skip
    rng.shuffle(events)
    return events


def brute_force(events: list[dict]) -> tuple[float, float, float]:
    """(idle, compute, non-compute) in percent, from the event dicts: the GPU work of the steps but the last
    (launched by a call made from the first step's start to the last step's start; with no call, started in that
    time or on its stream before such work started; not left over from before the steps), each microsecond of
    the window between its first start and its last end counted once, whatever the streams."""
    starts = sorted(e["ts"] for e in events if e["name"].startswith("ProfilerStep#"))
    first, last = starts[0], starts[-1]
    calls = {e["args"]["correlation"]: e["ts"] for e in events if e["cat"] == "cuda_runtime"}
    lowest = min((c for c, ts in calls.items() if ts >= first), default=None)
    work = [e for e in events if e["cat"] in GPU_CATS]
    linked = [e for e in work if e["args"].get("correlation") in calls]
    counted = [e for e in linked if first <= calls[e["args"]["correlation"]] < last]
    for e in work:
        if e in linked or e["ts"] < first:
            continue
        on_stream = [c["ts"] for c in counted if c["tid"] == e["tid"] and c in linked]
        if e["ts"] < max([last, *on_stream]) and not (
            lowest is not None and e["args"].get("correlation", lowest) < lowest
        ):
            counted.append(e)
    if not counted:
        counted = work
    busy = {us for e in counted for us in range(e["ts"], e["ts"] + e["dur"])}
    compute = {us for e in counted if e["cat"] == "kernel" and "nccl" not in e["name"].lower()
               for us in range(e["ts"], e["ts"] + e["dur"])}  # fmt: skip
    window = max(e["ts"] + e["dur"] for e in counted) - min(e["ts"] for e in counted)
    if window <= 0:
        return 0.0, 0.0, 0.0
    return (
        100 * (window - len(busy)) / window,
        100 * len(compute) / window,
        100 * (len(busy) - len(compute)) / window,
    )


@pytest.mark.parametrize("seed", range(60))
def test_timeline_of_generated_multi_stream_traces_equals_a_brute_force_union(tmp_path, seed):
    events = generated(random.Random(seed))
    if not any(e["cat"] in GPU_CATS for e in events):
        return
    idle, compute, non_compute = brute_force(events)
    timeline = gpu_timeline(events, host_steps(events))
    assert (timeline.idle_pct, timeline.compute_pct, timeline.non_compute_pct) == pytest.approx(
        (idle, compute, non_compute), abs=0.01
    )
    figures = trace_figures(load(tmp_path, events))  # the typed reader's columns, what report shows
    assert (figures.idle_pct, figures.compute_pct, figures.non_compute_pct) == pytest.approx(
        (idle, compute, non_compute), abs=0.01
    )


# ---------------------------------------------------------------------------------------------------------
# Nanosecond timestamps, overlapping streams: the exact union (hypothesis)
# ---------------------------------------------------------------------------------------------------------

STEP_US = 500.0


@st.composite
def launched_work(draw) -> list[dict]:
    """Three steps of 500 us; kernels, collectives and copies launched in them onto 1-4 streams, at nanosecond
    timestamps (Kineto's "ns" time unit), overlapping within and across streams, some of the first two steps'
    running under the last step's own (left out, as HTA leaves the last step out)."""
    events = [x(f"ProfilerStep#{n}", "user_annotation", n * STEP_US, STEP_US) for n in range(3)]
    ns = st.integers(0, 3 * int(STEP_US) * 1000 - 1).map(lambda v: v / 1000)
    kinds = st.sampled_from([("sgemm", "kernel"), (NCCL, "kernel"), ("Memcpy DtoD", "gpu_memcpy")])
    for corr, (at, lag, dur, (name, cat), stream) in enumerate(
        draw(st.lists(st.tuples(ns, ns, ns, kinds, st.sampled_from([7, 9, 13, 20])), min_size=1, max_size=12))
    ):
        events.append(x("cudaLaunchKernel", "cuda_runtime", at, 0.5, correlation=corr + 1))
        events.append(gpu(name, at + lag / 4, dur / 2, stream, cat, correlation=corr + 1))
    return events


def exact_shares(events: list[dict]) -> tuple[float, float, float]:
    """(idle, compute, non-compute) in percent over the work launched before the last step's start: every
    elementary segment between two interval ends, counted once when some interval covers its middle."""
    calls = {e["args"]["correlation"]: e["ts"] for e in events if e["cat"] == "cuda_runtime"}
    work = [e for e in events if e["cat"] in GPU_CATS and calls[e["args"]["correlation"]] < 2 * STEP_US]
    spans = [(e["ts"], e["ts"] + e["dur"], e["cat"] == "kernel" and e["name"] != NCCL) for e in work]
    points = sorted({p for lo, hi, _ in spans for p in (lo, hi)})
    busy = compute = 0.0
    for lo, hi in zip(points, points[1:], strict=False):
        covering = [is_compute for a, b, is_compute in spans if a < (lo + hi) / 2 < b]
        busy += (hi - lo) * bool(covering)
        compute += (hi - lo) * any(covering)
    window = points[-1] - points[0]
    return 100 * (window - busy) / window, 100 * compute / window, 100 * (busy - compute) / window


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(launched_work())
def test_nanosecond_multi_stream_timelines_equal_the_exact_union(tmp_path_factory, events):
    work = [e for e in events if e["cat"] in GPU_CATS]
    calls = {e["args"]["correlation"]: e["ts"] for e in events if e["cat"] == "cuda_runtime"}
    counted = [e for e in work if calls[e["args"]["correlation"]] < 2 * STEP_US]
    assume(counted and max(e["ts"] + e["dur"] for e in counted) > min(e["ts"] for e in counted))
    expected = exact_shares(events)
    timeline = gpu_timeline(events, host_steps(events))
    assert (timeline.idle_pct, timeline.compute_pct, timeline.non_compute_pct) == pytest.approx(
        expected, abs=0.01
    )
    figures = trace_figures(load(tmp_path_factory.mktemp("t"), events))
    assert (figures.idle_pct, figures.compute_pct, figures.non_compute_pct) == pytest.approx(
        expected, abs=0.01
    )
