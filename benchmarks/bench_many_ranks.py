"""`lightning-perf report --jobs N` on a folder of many ranks' traces, against HolisticTraceAnalysis.

Builds, in a temporary directory, a folder of ``--ranks`` traces from one tests/data/realtraces trace (default
``ddp_a100_rank1_of2``, 33 MB of JSON): each file gets its rank and world size in ``distributedInfo`` and in its
name (``rank-N.json.gz``, gzip level 1), and one rank (``--slow-rank``) has every kernel's duration stretched by
``--stretch``. Then, each in a process of its own, timed by wall clock:

- ``lightning-perf report FOLDER --format json --jobs N`` (default N: the usable cores), on ``--compare-ranks``
  files (a folder of links to the first ones) and on all of them: total seconds, MB/s of uncompressed JSON,
  and the peak RSS of the whole run (the report and its worker processes: the largest sum of their RSS, sampled
  every 20 ms with psutil; and the largest single process): memory must not grow with the ranks;
- HolisticTraceAnalysis: ``TraceAnalysis(trace_dir=FOLDER)`` + ``get_temporal_breakdown`` on the same folder,
  in the interpreter of ``--hta-python`` (its own venv), with its peak RSS the same way.

Usage: python benchmarks/bench_many_ranks.py [--ranks 64] [--compare-ranks 16] [--jobs N] [--no-hta]
       [--hta-python /work/venv-hta/bin/python] [--source ddp_a100_rank1_of2] [--slow-rank 9] [--stretch 1.35]
       [--baseline DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lightning_perf.traces.read.parallel_reader import default_jobs  # noqa: E402
from lightning_perf.traces.report.build import find_traces  # noqa: E402

REALTRACES = REPO / "tests" / "data" / "realtraces"
CLI = "import sys; from lightning_perf.cli import main; sys.exit(main(sys.argv[1:]))"
HTA_SCRIPT = """
import sys, logging
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
analysis = TraceAnalysis(trace_dir=sys.argv[1])
analysis.get_temporal_breakdown(visualize=False)
"""


def _write_rank(folder: str, rank: int, world: int, head: dict, events_text: str) -> None:
    head = {**head, "distributedInfo": {**head.get("distributedInfo", {}), "rank": rank, "world_size": world}}
    top = json.dumps(head)[:-1]  # without its closing brace
    with gzip.open(os.path.join(folder, f"rank-{rank}.json.gz"), "wt", compresslevel=1) as out:
        out.write(top + ', "traceEvents": ')
        out.write(events_text)
        out.write("}\n")


def build_folder(folder: str, source: str, ranks: int, slow_rank: int, stretch: float, jobs: int) -> float:
    """Write the ranks' traces; returns the MB of uncompressed JSON of one."""
    with gzip.open(source, "rt") as fh:
        trace = json.load(fh)
    events = trace.pop("traceEvents")
    normal = json.dumps(events)
    # the slow rank: everything it does takes `stretch` times as long (times stretched from its first event)
    start = min(e["ts"] for e in events if isinstance(e.get("ts"), (int, float)))
    for event in events:
        if isinstance(event.get("ts"), (int, float)):
            event["ts"] = start + (event["ts"] - start) * stretch
        if isinstance(event.get("dur"), (int, float)):
            event["dur"] *= stretch
    slow = json.dumps(events)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        done = [
            pool.submit(_write_rank, folder, rank, ranks, trace, slow if rank == slow_rank else normal)
            for rank in range(ranks)
        ]
        for future in done:
            future.result()
    return len(normal) / 1e6


def run_measured(command: list[str], env: dict[str, str] | None = None) -> tuple[float, float, float, str]:
    """(wall seconds, peak summed RSS MB of the process tree, peak RSS MB of its largest process, stdout)."""
    peak = [0.0, 0.0]
    start = time.perf_counter()
    proc = psutil.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                tree = [proc, *proc.children(recursive=True)]
                total = 0
                for p in tree:
                    with contextlib.suppress(psutil.Error):  # a worker that just ended
                        rss = p.memory_info().rss
                        total += rss
                        peak[1] = max(peak[1], rss / 1e6)
                peak[0] = max(peak[0], total / 1e6)
            except psutil.Error:
                pass
            stop.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    stop.set()
    sampler.join()
    if proc.returncode not in (0, 1) or (proc.returncode and not out):
        raise RuntimeError(f"{command[:4]} failed ({proc.returncode}): {err.strip()[-2000:]}")
    return wall, peak[0], peak[1], out


def report(folder: str, jobs: int, code: str | None = None) -> tuple[float, float, float, dict]:
    """``lightning-perf report`` of ``folder``; ``code``: a folder holding another version of the package to run
    instead of this checkout's (``--baseline``)."""
    env = None if code is None else {**os.environ, "PYTHONPATH": code}
    command = [
        sys.executable,
        "-c",
        CLI,
        "report",
        folder,
        "--format",
        "json",
        "--jobs",
        str(jobs),
    ]
    wall, peak, child_max, out = run_measured(command, env)
    return wall, peak, child_max, json.loads(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--compare-ranks", type=int, default=16, help="a smaller folder, to show flat memory")
    parser.add_argument("--jobs", type=int, default=default_jobs())
    parser.add_argument("--source", default="ddp_a100_rank1_of2")
    parser.add_argument("--slow-rank", type=int, default=9)
    parser.add_argument("--stretch", type=float, default=1.35)
    parser.add_argument("--hta-python", default="/work/venv-hta/bin/python")
    parser.add_argument("--no-hta", action="store_true")
    parser.add_argument(
        "--baseline",
        help="a folder holding another version of lightning_perf (e.g. git archive of an older commit): its report"
        " is run just before this checkout's on each folder, and the two outputs compared",
    )
    args = parser.parse_args()
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    (source,) = find_traces(str(REALTRACES / args.source))
    with tempfile.TemporaryDirectory() as tmp:
        full = os.path.join(tmp, f"{args.ranks}_ranks")
        os.mkdir(full)
        start = time.perf_counter()
        mb = build_folder(full, source, args.ranks, args.slow_rank, args.stretch, args.jobs)
        print(
            f"built {args.ranks} ranks of {args.source} ({mb:.1f} MB of JSON each, rank {args.slow_rank}'s times"
            f" x{args.stretch}) in {time.perf_counter() - start:.1f} s; report --jobs {args.jobs}, "
            f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}"
        )
        folders = []
        if 0 < args.compare_ranks < args.ranks:
            small = os.path.join(tmp, f"{args.compare_ranks}_ranks")
            os.mkdir(small)
            for rank in range(args.compare_ranks):
                name = f"rank-{rank}.json.gz"
                os.symlink(os.path.join(full, name), os.path.join(small, name))
            folders.append((args.compare_ranks, small))
        folders.append((args.ranks, full))
        print(
            f"{'ranks':>5} {'JSON MB':>8} | {'report s':>8} {'MB/s':>6} {'peak RSS MB (tree)':>18}"
            f" {'largest process MB':>18} | {'HTA s':>7} {'HTA peak RSS MB':>15} {'HTA/report':>10}"
        )
        for ranks, folder in folders:
            if args.baseline:
                base_wall, _, _, base_data = report(folder, args.jobs, args.baseline)
            wall, peak, child_max, data = report(folder, args.jobs)
            if args.baseline:
                same = "the same JSON" if base_data == data else "DIFFERENT JSON"
                print(f"      baseline ({args.baseline}): {base_wall:.2f} s, this code {wall:.2f} s, {same}")
            steps = {t["rank"]: t["figures"].get("step_ms") for t in data["traces"]}
            hta_text = "-"
            if not args.no_hta and os.path.exists(args.hta_python):
                hta_wall, hta_peak, _, _ = run_measured([args.hta_python, "-c", HTA_SCRIPT, folder])
                hta_text = f"{hta_wall:7.1f} {hta_peak:15.0f} {hta_wall / wall:9.1f}x"
            print(
                f"{ranks:5d} {ranks * mb:8.0f} | {wall:8.2f} {ranks * mb / wall:6.0f} {peak:18.0f}"
                f" {child_max:18.0f} | {hta_text}"
            )
            others = [v for r, v in steps.items() if r != args.slow_rank and v is not None]
            if args.slow_rank in steps and others:
                print(
                    f"      step ms: rank {args.slow_rank} {steps[args.slow_rank]:.1f}, median of the others "
                    f"{statistics.median(others):.1f}"
                )


if __name__ == "__main__":
    main()
