"""A folder that takes no new file, for the tests of outputs checked before any fit (also as root)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def locked(folder: Path) -> Iterator[None]:
    """``folder`` takes no new file: mode 0o500, or for root (who writes through modes) the immutable flag."""
    folder.chmod(0o500)
    immutable = False
    try:
        if os.access(folder, os.W_OK):
            immutable = subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0
            probe = folder / "probe"
            try:
                probe.touch()
            except OSError:
                pass
            else:
                probe.unlink()
                pytest.skip("cannot make a folder unwritable here (root without chattr)")
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        folder.chmod(0o700)
