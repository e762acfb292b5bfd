"""`lightning-perf report` against torch-tb-profiler and HolisticTraceAnalysis on the real GPU traces.

On every folder of tests/data/realtraces (see its README), in one run, the median of ``--repeat`` timings of:

- lightning-perf ``report``: ``build_report`` on the folder (streaming read, Overview breakdown, GPU timeline,
  blocking calls, copies, tensor cores, memory, findings, operator tables): everything ``lightning-perf report``
  prints. Timed in this process with glibc's allocator defaults, as a Python caller of ``build_report`` gets it; the
  ``lightning-perf report`` command and its workers also keep freed memory for the next trace
  (``traces/read/allocator.py``), which ``bench_many_ranks.py`` measures;
- lightning-perf end of fit: ``trace_figures(load_trace(path))``, what the callback runs on each of its own
  recorded cycles after the last step (``output/trace_findings.read_cycles``);
- torch-tb-profiler 0.4.3: ``RunProfileData.parse`` + ``process`` + ``analyze`` on the trace, what its
  TensorBoard plugin runs to load a run before it can draw anything (as tests/helpers.py ``plugin_profile``);
- HolisticTraceAnalysis: ``TraceAnalysis(trace_dir=...)`` (parse) + ``get_temporal_breakdown``, run in the
  separate virtual environment given by ``--hta-python`` (HTA pins its own pandas/numpy); skipped with a note
  when that interpreter is missing or HTA cannot load the folder;
- the loader alone (``load_trace``), the part of both above that reads the file;
- bare typed decoding, the ceiling of any reader of these files: gunzip the file and decode it with msgspec into
  the Structs of lightning-perf's typed reader (``traces/event_types.Event``: only the fields the analyses
  read), nothing else; and the gunzip alone (both with the reader's decompressor: ISA-L where installed).

The five are timed in turns (one run of each, ``--repeat`` times), so a change in a shared machine's load falls
on all of them alike. Then the targets of issue 23: report within 2x of bare decoding on each trace, >= 250 MB/s of JSON per core over
the four (CPU time), >= 10x faster than HTA, >= 20x faster than torch-tb-profiler.

It prints, per trace, lightning-perf's seconds, seconds per 100 MB and MB/s of both the gzip file and the
uncompressed JSON, and the other tools' seconds with their ratio to ``report``.
Usage: python benchmarks/bench_report_tools.py [--repeat 3] [--hta-python /work/venv-hta/bin/python]
       [--ours-only]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import msgspec  # noqa: E402

from lightning_perf.traces.figures.gpu_figures import trace_figures  # noqa: E402
from lightning_perf.traces.read.event_types import Event  # noqa: E402
from lightning_perf.traces.read.gunzip import open_gzip  # noqa: E402
from lightning_perf.traces.read.loader import load_trace  # noqa: E402
from lightning_perf.traces.report.build import build_report, find_traces  # noqa: E402

REALTRACES = REPO / "tests" / "data" / "realtraces"
# Run by the HTA interpreter: time the parse and the temporal breakdown of one folder, print JSON.
HTA_SCRIPT = """
import json, sys, time, logging
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
times, result = [], None
for _ in range(int(sys.argv[2])):
    start = time.perf_counter()
    analysis = TraceAnalysis(trace_dir=sys.argv[1])
    frame = analysis.get_temporal_breakdown(visualize=False)
    times.append(time.perf_counter() - start)
    result = frame[["idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg"]].iloc[0].tolist()
print(json.dumps({"times": times, "breakdown": result}))
"""


class TypedTrace(msgspec.Struct):
    traceEvents: list[Event]  # noqa: N815 - the trace's key


TYPED_DECODER = msgspec.json.Decoder(TypedTrace)


def bare_decode(path: str) -> None:
    """Gunzip the whole file and decode it into the typed Structs: no analysis, no bounded memory. The same
    decompressor as the reader's (ISA-L where installed), so the ratio compares like with like."""
    with open_gzip(path) as fh:
        TYPED_DECODER.decode(fh.read())


def gunzip(path: str) -> None:
    with open_gzip(path) as fh:
        fh.read()


def median_time(fn, repeat: int) -> float:
    return median_times(fn, repeat)[0]


def median_times(fn, repeat: int) -> tuple[float, float]:
    """Median wall-clock and CPU seconds of ``fn``: on a shared machine the CPU time is what the work costs
    (about the wall-clock time of an idle core), the wall-clock time what it took there."""
    walls, cpus = [], []
    for _ in range(repeat):
        start, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def interleaved_times(fns: list, repeat: int) -> list[tuple[float, float]]:
    """:func:`median_times` of each of ``fns``, measured in turns (one run of each, ``repeat`` times)."""
    walls: list[list[float]] = [[] for _ in fns]
    cpus: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, wall, cpu_times in zip(fns, walls, cpus, strict=True):
            start, cpu = time.perf_counter(), time.process_time()
            fn()
            wall.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - cpu)
    return [(statistics.median(w), statistics.median(c)) for w, c in zip(walls, cpus, strict=True)]


def tb_profiler_load(path: str) -> None:
    from torch_tb_profiler.profiler.data import RunProfileData

    with tempfile.TemporaryDirectory() as cache:
        data = RunProfileData.parse("worker", None, path, cache)
        data.process()
        data.analyze()


def hta_load(python: str, folder: Path, repeat: int) -> tuple[float | None, str]:
    if not os.path.exists(python):
        return None, f"no HTA interpreter at {python}"
    with tempfile.TemporaryDirectory() as tmp:
        # HTA wants rank-N names in a folder of its own
        for path in find_traces(str(folder)):
            os.symlink(path, os.path.join(tmp, "rank-0.json.gz" if path.endswith(".gz") else "rank-0.json"))
        run = subprocess.run([python, "-c", HTA_SCRIPT, tmp, str(repeat)], capture_output=True, text=True)
    if run.returncode != 0:
        return None, "HTA failed: " + (run.stderr.strip().splitlines() or ["?"])[-1]
    data = json.loads(run.stdout.strip().splitlines()[-1])
    idle, compute, non_compute = data["breakdown"]
    return statistics.median(data["times"]), f"HTA idle/compute/non-compute {idle}/{compute}/{non_compute}%"


def per_100mb(seconds: float, mb: float) -> str:
    """'s per 100 MB, MB/s' of a time over a size."""
    return f"{seconds * 100.0 / mb:6.2f} {mb / seconds:6.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--hta-python", default="/work/venv-hta/bin/python")
    parser.add_argument("--ours-only", action="store_true", help="time lightning-perf alone (no other tools)")
    args = parser.parse_args()
    rows = []
    bares = []
    for folder in sorted(p for p in REALTRACES.iterdir() if p.is_dir()):
        (path,) = find_traces(str(folder))
        gz_mb = os.path.getsize(path) / 1e6
        with gzip.open(path) as fh:
            mb = len(fh.read()) / 1e6
        # one round of each at a time, so that a change in the machine's load falls on all of them alike
        (ours, ours_cpu), (end_of_fit, end_cpu), (bare, bare_cpu), (_, unzip), (_, load_cpu) = (
            interleaved_times(
                [
                    lambda folder=folder: build_report(str(folder)),
                    lambda path=path: trace_figures(load_trace(path)),
                    lambda path=path: bare_decode(path),
                    lambda path=path: gunzip(path),
                    lambda path=path: load_trace(path),
                ],
                args.repeat,
            )
        )
        bares.append((bare, bare_cpu, unzip, load_cpu))
        tb = hta = None
        note = ""
        if not args.ours_only:
            tb = median_time(lambda path=path: tb_profiler_load(path), args.repeat)
            hta, note = hta_load(args.hta_python, folder, args.repeat)
        rows.append((folder.name, gz_mb, mb, ours, end_of_fit, tb, hta, note, ours_cpu, end_cpu))
    print(
        f"median of {args.repeat} runs; per trace: seconds, then s per 100 MB and MB/s of the gzip file (gz) and"
    )
    print(
        "of the uncompressed JSON (raw); the other tools' seconds and their time over lightning-perf report's"
    )
    print(
        f"{'trace':23} {'gz MB':>5} {'raw MB':>6} | {'report s':>8} {'gz s/100MB MB/s':>15} {'raw s/100MB MB/s':>16}"
        f" | {'end of fit s':>12} {'raw s/100MB':>11} | {'torch-tb-profiler':>17} {'HTA':>12}"
    )
    for name, gz_mb, mb, ours, end_of_fit, tb, hta, note, _, _ in rows:
        tb_text = "-" if tb is None else f"{tb:.2f} {tb / ours:.1f}x"
        hta_text = "-" if hta is None else f"{hta:.2f} {hta / ours:.1f}x"
        print(
            f"{name:23} {gz_mb:5.2f} {mb:6.1f} | {ours:8.3f} {per_100mb(ours, gz_mb):>15} {per_100mb(ours, mb):>16}"
            f" | {end_of_fit:12.3f} {end_of_fit * 100.0 / mb:11.2f} | {tb_text:>17} {hta_text:>12}  {note}"
        )
    total_gz, total_mb = sum(r[1] for r in rows), sum(r[2] for r in rows)
    total, total_end = sum(r[3] for r in rows), sum(r[4] for r in rows)
    print(
        f"{'all four':23} {total_gz:5.2f} {total_mb:6.1f} | {total:8.3f} {per_100mb(total, total_gz):>15}"
        f" {per_100mb(total, total_mb):>16} | {total_end:12.3f} {total_end * 100.0 / total_mb:11.2f}"
    )
    print("CPU time of lightning-perf (what the work costs one core, whatever else runs on the machine):")
    print(
        f"{'trace':23} | {'report s':>8} {'gz s/100MB':>10} {'raw s/100MB':>11} | {'end of fit s':>12} {'raw s/100MB':>11}"
    )
    for name, gz_mb, mb, *_, ours_cpu, end_cpu in rows:
        print(
            f"{name:23} | {ours_cpu:8.3f} {ours_cpu * 100.0 / gz_mb:10.1f} {ours_cpu * 100.0 / mb:11.2f}"
            f" | {end_cpu:12.3f} {end_cpu * 100.0 / mb:11.2f}"
        )
    print("bare typed decoding (gunzip + msgspec into the reader's Structs, nothing else), CPU seconds:")
    print(
        f"{'trace':23} | {'gunzip s':>8} {'bare s':>7} {'bare MB/s':>9} | {'report s':>8} {'report MB/s':>11}"
        f" {'report/bare':>11} | {'end of fit/bare':>15} | {'load_trace/bare':>15}"
    )
    for row, (_, bare_cpu, unzip, load_cpu) in zip(rows, bares, strict=True):
        name, _, mb, *_, ours_cpu, end_cpu = row
        print(
            f"{name:23} | {unzip:8.3f} {bare_cpu:7.3f} {mb / bare_cpu:9.0f} | {ours_cpu:8.3f} {mb / ours_cpu:11.0f}"
            f" {ours_cpu / bare_cpu:10.2f}x | {end_cpu / bare_cpu:14.2f}x | {load_cpu / bare_cpu:14.2f}x"
        )
    print_targets(rows, bares)


def print_targets(rows: list[tuple], bares: list[tuple]) -> None:
    """Issue 23's targets against what this run measured (CPU time for the per-core figures)."""
    worst = max(row[8] / bare[1] for row, bare in zip(rows, bares, strict=True))
    total_mb, total_cpu = sum(r[2] for r in rows), sum(r[8] for r in rows)
    print("targets (issue 23):")
    print(f"  report within 2x of bare decoding on each trace: worst {worst:.2f}x  {_met(worst <= 2.0)}")
    per_core = total_mb / total_cpu
    print(f"  >= 250 MB/s of JSON per core over the four: {per_core:.0f} MB/s  {_met(per_core >= 250.0)}")
    for label, index, target in (("HTA", 6, 10.0), ("torch-tb-profiler", 5, 20.0)):
        ratios = [r[index] / r[3] for r in rows if r[index] is not None]
        if ratios:
            least = min(ratios)
            print(f"  >= {target:.0f}x faster than {label}: least {least:.1f}x  {_met(least >= target)}")
        else:
            print(f"  >= {target:.0f}x faster than {label}: not measured")


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


if __name__ == "__main__":
    main()
