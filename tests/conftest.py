"""Shared fixtures: the real GPU traces recorded by other people (tests/data/realtraces, vendored with their
sources and licences in its README)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# The suite's own cache (the device peak's): a peak cached on this machine by an earlier run, or by a run beside
# other work, must not decide what a test sees (CI read a peak of 16.8 GFLOP/s cached hours before where the
# machine does 150, and a test's CNN lost its low_mfu). Set before any test, so the commands tests start get it.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="lightning_perf_test_cache_")
REALTRACES = REPO / "tests" / "data" / "realtraces"


@pytest.fixture(scope="session")
def realtraces() -> Path:
    """The folder of real traces, part of the repository: a checkout without it is broken, not skipped."""
    assert REALTRACES.is_dir(), f"no real traces at {REALTRACES}: the checkout is incomplete"
    return REALTRACES


@pytest.fixture
def cpu_hogs():
    """Two processes spinning on the CPU, detached (not children of this process, so not taken for workers)."""
    command = f"for i in 1 2; do {sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!; done"
    pids = [
        int(p) for p in subprocess.run(["sh", "-c", command], capture_output=True, text=True).stdout.split()
    ]
    time.sleep(0.5)
    yield pids
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


@pytest.fixture(autouse=True)
def sigint_as_it_was():
    """Lightning answers a KeyboardInterrupt in ``fit`` by ignoring SIGINT for the rest of the process, and an
    ignored signal stays ignored in every process started after: a later test's Ctrl-C to a ``tune`` it started
    (or from a DataLoader worker to this process) was then lost, in whichever test runner process drew the
    interrupt test first (CI: two failures, 136 s each). Each test gets SIGINT back as it found it."""
    handler = signal.getsignal(signal.SIGINT)
    yield
    if signal.getsignal(signal.SIGINT) is not handler:
        signal.signal(signal.SIGINT, handler)
