"""Shared fixtures: the real GPU traces recorded by other people (tests/data/realtraces, vendored with their
sources and licences in its README)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REALTRACES = REPO / "tests" / "data" / "realtraces"


@pytest.fixture(scope="session")
def realtraces() -> Path:
    """The folder of real traces, part of the repository: a checkout without it is broken, not skipped."""
    assert REALTRACES.is_dir(), f"no real traces at {REALTRACES}: the checkout is incomplete"
    return REALTRACES
