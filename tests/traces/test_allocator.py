"""Processes that read trace after trace keep the memory they free (glibc's mallopt): the second read of a real
trace page-faults a small fraction of what it does with glibc's defaults, and the process's peak stays what it
was. Counted in fresh interpreters (page faults, not time: no flaky clock)."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys

import pytest

from lightning_perf.traces.read import allocator
from lightning_perf.traces.report.build import find_traces

READ_TWICE = """
import json, resource, sys
from lightning_perf.traces.read.allocator import keep_freed_memory
from lightning_perf.traces.report.build import analyse_trace
kept = keep_freed_memory() if sys.argv[2] == "keep" else None
analyse_trace(sys.argv[1])  # the first read grows the process to its peak either way
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
analyse_trace(sys.argv[1])
after = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"kept": kept, "faults": after.ru_minflt - before, "peak_kb": after.ru_maxrss}))
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
    default, kept = read_twice(path, "default"), read_twice(path, "keep")
    assert kept["kept"] is True
    # ddp_a100_rank1_of2 read with ISA-L's gunzip: 9,660-9,900 faults by default, 1,950-2,190 kept (zlib's gzip:
    # 17,200 against 1,630-1,900)
    assert kept["faults"] * 3 < default["faults"], (default, kept)
    assert kept["peak_kb"] < 1.25 * default["peak_kb"], (default, kept)


def test_without_mallopt_nothing_changes(monkeypatch):
    def no_libc(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", no_libc)
    assert allocator.keep_freed_memory() is False
