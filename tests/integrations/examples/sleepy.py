"""Storage that waits: a dataset class's ``__getitem__`` sleeps ``delay_s`` a sample, so DataLoader workers help.

Imported by the examples beside it (the tests copy the folder; each example runs as ``python example.py``).
"""

from __future__ import annotations

import functools
import time


def sleepy(cls: type, delay_s: float) -> None:
    """Make every ``cls.__getitem__`` call wait ``delay_s`` first (a no-op for 0)."""
    if delay_s <= 0:
        return
    original = cls.__getitem__

    @functools.wraps(original)
    def __getitem__(self, index):  # noqa: N807 - the method it wraps
        time.sleep(delay_s)
        return original(self, index)

    cls.__getitem__ = __getitem__


def arguments(argv: list[str]) -> tuple[int, float, str | None]:
    """``[STEPS [SLEEP_MS [PERF_DIR]]]``: the fit's steps, each sample's wait, where PerfCallback writes."""
    steps = int(argv[0]) if argv else 40
    sleep_s = float(argv[1]) / 1e3 if len(argv) > 1 else 0.0
    return steps, sleep_s, argv[2] if len(argv) > 2 else None
