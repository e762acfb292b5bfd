"""Small checks and formats for numbers, shared by the diagnosis, comparison, reports and argument checks.

A bool is never a number here (``True`` would otherwise pass as 1).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Any

# The project's units, as the metric docs say: every MB is 1e6 bytes and every GB 1e9 (never MiB or GiB).
BYTES_PER_MB = 1e6
BYTES_PER_GB = 1e9
MB_PER_GB = 1000.0


def is_number(value: Any) -> bool:
    """An int or float (NaN and infinities included), not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def finite(value: Any) -> float | None:
    """A finite number as float, or ``None`` for anything absent or not measurable."""
    if not is_number(value) or not math.isfinite(value):
        return None
    return float(value)


def median_known(values: Iterable[float | None]) -> float | None:
    """The median of the values measured (``None`` left out); ``None`` where none was."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def whole(value: Any) -> int | None:
    """An int as itself, or ``None`` for anything else (floats and bools included)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def fmt1(value: float | None) -> str:
    """One decimal, or ``n/a`` when not measured."""
    return "n/a" if value is None else f"{value:.1f}"


# Units of size_text from the largest down; a size is shown in the largest unit it holds at least one of.
_SIZE_UNITS = (("GB", BYTES_PER_GB), ("MB", BYTES_PER_MB), ("kB", 1e3))


def size_text(mb: float | None) -> str:
    """A size given in MB (1e6 bytes), in the unit that shows it: ``3.2 kB``, ``12.5 MB``, ``1.23 GB``, ``640 B``.

    Three significant figures: below 1 MB a trace or a memory reading would otherwise read ``0.0 MB``.
    """
    value = finite(mb)
    if value is None:
        return "n/a"
    size = value * BYTES_PER_MB
    for unit, scale in _SIZE_UNITS:
        shown = f"{size / scale:.3g}"
        if abs(float(shown)) >= 1:  # 999.7 kB rounds to "1e+03": that is 1 MB, caught by the unit above
            return f"{shown} {unit}"
    return f"{size:.0f} B"
