from __future__ import annotations

import pytest

from tests.faults.checks import restore_sigint, seeded_fit, weights  # noqa: F401 - fixtures

__all__ = ["restore_sigint"]


@pytest.fixture(scope="session")
def reference_weights(tmp_path_factory):
    """The weights a fit reaches without PerfCallback: what every fault case must reach too."""
    _, model = seeded_fit(tmp_path_factory.mktemp("reference"), [])
    return weights(model)
