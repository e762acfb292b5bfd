"""Small checks and formats for measured numbers, shared by the diagnosis, comparison and reports."""

from __future__ import annotations

import math
from typing import Any


def finite(value: Any) -> float | None:
    """A finite number as float, or ``None`` for anything absent or not measurable (bools are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def fmt1(value: float | None) -> str:
    """One decimal, or ``n/a`` when not measured."""
    return "n/a" if value is None else f"{value:.1f}"
