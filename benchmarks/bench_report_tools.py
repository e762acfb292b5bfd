"""`lightning-perf report` against torch-tb-profiler and HolisticTraceAnalysis on the real GPU traces.

On every folder of shared/realtraces (see its README), in one run, the median of ``--repeat`` timings of:

- lightning-perf: ``build_report`` on the folder (streaming read, Overview breakdown, GPU timeline, blocking
  calls, copies, tensor cores, memory, findings, operator tables): everything ``lightning-perf report`` prints;
- torch-tb-profiler 0.4.3: ``RunProfileData.parse`` + ``process`` + ``analyze`` on the trace, what its
  TensorBoard plugin runs to load a run before it can draw anything (as tests/helpers.py ``plugin_profile``);
- HolisticTraceAnalysis: ``TraceAnalysis(trace_dir=...)`` (parse) + ``get_temporal_breakdown``, run in the
  separate virtual environment given by ``--hta-python`` (HTA pins its own pandas/numpy); skipped with a note
  when that interpreter is missing or HTA cannot load the folder.

It prints seconds per trace, seconds per 100 MB of uncompressed trace and the ratios to lightning-perf.
Usage: python benchmarks/bench_report_tools.py [--repeat 3] [--hta-python /work/venv-hta/bin/python]
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

from lightning_perf.traces.report import build_report, find_traces  # noqa: E402

REALTRACES = REPO.parent / "shared" / "realtraces"
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


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--hta-python", default="/work/venv-hta/bin/python")
    args = parser.parse_args()
    rows = []
    for folder in sorted(p for p in REALTRACES.iterdir() if p.is_dir()):
        (path,) = find_traces(str(folder))
        with gzip.open(path) as fh:
            mb = len(fh.read()) / 1e6
        ours = median_time(lambda folder=folder: build_report(str(folder)), args.repeat)
        tb = median_time(lambda path=path: tb_profiler_load(path), args.repeat)
        hta, note = hta_load(args.hta_python, folder, args.repeat)
        rows.append((folder.name, mb, ours, tb, hta, note))
    print(f"median of {args.repeat} runs, seconds (s per 100 MB of uncompressed trace)")
    print(f"{'trace':26} {'MB':>5}  {'lightning-perf':>16}  {'torch-tb-profiler':>22}  {'HTA':>22}")
    for name, mb, ours, tb, hta, note in rows:
        per = 100.0 / mb
        hta_text = "-" if hta is None else f"{hta:.2f} ({hta * per:.1f}) {hta / ours:.1f}x"
        print(
            f"{name:26} {mb:5.1f}  {ours:6.2f} ({ours * per:5.1f})  {tb:6.2f} ({tb * per:5.1f}) {tb / ours:4.1f}x"
            f"  {hta_text:>22}  {note}"
        )


if __name__ == "__main__":
    main()
