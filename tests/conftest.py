"""Shared fixtures: the real GPU traces recorded by other people (shared/realtraces beside the repository)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REALTRACES = REPO.parent / "shared" / "realtraces"


@pytest.fixture(scope="session")
def realtraces() -> Path:
    """The folder of real traces; tests that need it are skipped where the checkout has no shared/ beside it."""
    if not REALTRACES.is_dir():
        pytest.skip(f"no real traces at {REALTRACES}")
    return REALTRACES
