"""A worker (a trial round's process) dies with the parent that started it, however the parent dies (Linux).

Pure standard library: the bootstrap of a command's round calls it before anything is imported.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

from lightning_perf.processes import alive
from lightning_perf.trial.runner import PARENT_ENV


def die_with_parent() -> None:
    """Linux: be killed when the parent that started this worker dies, however it dies (SIGKILL included),
    so a worker never outlives its trial; its DataLoader workers follow it (they watch their parent)."""
    parent = os.environ.pop(PARENT_ENV, None)  # this worker's own children are not told
    if parent is None or not parent.isdigit() or not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if str(os.getppid()) != parent and not alive(int(parent)):  # it died before the request was made
        os._exit(128 + signal.SIGKILL)
