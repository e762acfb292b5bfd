"""Processes that read trace after trace keep the memory they free (glibc's mallopt): the second read of a real
trace page-faults a small fraction of what the first did, never more than with glibc's defaults, and the process's
peak stays what it was. Counted in fresh interpreters (page faults, not time: no flaky clock)."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys

import pytest

from lightning_perf.traces.read import allocator
from lightning_perf.traces.report.build import find_traces

# Transparent huge pages off in the child (prctl PR_SET_THP_DISABLE = 41): NumPy madvises its large arrays for
# huge pages, so with THP a fresh mapping faults once per 2 MiB when the kernel has a free huge page and once per
# 4 KiB when memory is fragmented; the default side then read 4,964 faults on a busy CI machine against its usual
# 9,660-11,464, and the comparison flaked. Counted in base pages, both sides measure the same thing every time.
READ_TWICE = """
import ctypes, json, resource, sys
ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)
from lightning_perf.traces.read.allocator import keep_freed_memory
from lightning_perf.traces.report.build import analyse_trace
kept = keep_freed_memory() if sys.argv[2] == "keep" else None
start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
analyse_trace(sys.argv[1])  # the first read grows the process to its peak either way
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
analyse_trace(sys.argv[1])
after = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"kept": kept, "first": before - start, "faults": after.ru_minflt - before, "peak_kb": after.ru_maxrss}))
"""


def read_twice(path: str, mode: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", READ_TWICE, path, mode],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's")
def test_a_second_trace_reuses_the_memory_the_first_freed(realtraces):
    (path,) = find_traces(str(realtraces / "ddp_a100_rank1_of2"))
    # the median of three fresh processes a side. The kept side's second read faults a fifth of its first
    # (ddp_a100_rank1_of2 with ISA-L's gunzip, huge pages off: 1,803-2,598 against ~9,900). The default side is
    # not a fixed yardstick: glibc's dynamic mmap threshold read 6,068-15,277 faults over a day of runs, and
    # 2,011-2,015 (it kept too) in one CI run, so against it the kept side is only never worse.
    runs = {mode: [read_twice(path, mode) for _ in range(3)] for mode in ("default", "keep")}
    default, kept = (sorted(r, key=lambda run: run["faults"])[1] for r in runs.values())
    assert kept["kept"] is True
    assert kept["faults"] * 2 < kept["first"], runs
    assert kept["faults"] < 1.5 * default["faults"] + 500, runs
    # ru_maxrss of a child starts at its parent's resident size at the fork, so it is compared, not bounded
    assert kept["peak_kb"] < 1.25 * default["peak_kb"], runs


def test_without_mallopt_nothing_changes(monkeypatch):
    def no_libc(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", no_libc)
    assert allocator.keep_freed_memory() is False
