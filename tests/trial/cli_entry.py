"""Entry points a user's project would have for a LightningCLI built with fixed classes (for ``--cli``)."""

from __future__ import annotations

from lightning.pytorch.cli import LightningCLI

from tests.helpers import TinyDataModule, TinyModel


def fixed_classes() -> tuple[type[TinyModel], type[TinyDataModule]]:
    """What ``LightningCLI(TinyModel, TinyDataModule)`` is built from."""
    return TinyModel, TinyDataModule


class FixedCLI(LightningCLI):
    """A project's own CLI subclass that fixes its classes."""

    def __init__(self, **kwargs) -> None:
        super().__init__(TinyModel, TinyDataModule, **kwargs)
