"""A LightningCLI subclass given its classes at the call site, with a linked argument (as in the README)."""

from lightning.pytorch.cli import LightningCLI
from slowdata import SleepyData, TinyModel


class MyCLI(LightningCLI):
    def add_arguments_to_parser(self, parser):
        parser.link_arguments("data.batch_size", "model.batch_size")


def main():
    MyCLI(TinyModel, SleepyData)


if __name__ == "__main__":
    main()
