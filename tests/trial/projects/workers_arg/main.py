"""Like Lightning's ImageNet example: a LightningCLI script whose datamodule calls its loader argument `workers`."""

from lightning.pytorch.cli import LightningCLI
from slowdata import TinyModel, WorkersData


def main():
    LightningCLI(TinyModel, WorkersData, trainer_defaults={"max_epochs": 1, "enable_progress_bar": False})


if __name__ == "__main__":
    main()
