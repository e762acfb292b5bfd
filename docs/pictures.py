"""The docs' pictures of what a user sees, made from real runs: ``python docs/pictures.py`` (10 s on a 2-core CPU).

- ``docs/images/end-of-fit.svg``: the answer PerfCallback logs at the end of ``fit``, from the README's quick
  start (the same model and slow synthetic data, fewer samples), rendered as the console shows it;
- ``docs/images/report.png``: ``lightning-perf report RUN_DIR --png`` on that run's profiler traces.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
from rich.console import Console
from rich.text import Text
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_perf import PerfCallback
from lightning_perf.cli import main as cli

IMAGES = Path(__file__).resolve().parent / "images"


class SlowData(Dataset):  # the README's quick start: synthetic samples, each read "from storage" in 2 ms
    def __len__(self):
        return 384

    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.randn(32), torch.randn(1)


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Lines(logging.Handler):
    """Every message of the ``lightning_perf`` logger, as the console shows it."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def end_of_fit(root: Path) -> Path:
    """Run the fit, save the answer it logs as an SVG, return the run's log dir."""
    lines = Lines()
    logger = logging.getLogger("lightning_perf")
    logger.addHandler(lines)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        trainer = L.Trainer(
            max_epochs=1,
            callbacks=[PerfCallback()],
            default_root_dir=root,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(Model(), DataLoader(SlowData(), batch_size=16))
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)
    # the run's folder as the user sees it, relative to where the script ran: lightning_logs/version_0
    answer = "\n".join(lines.lines).replace(f"{root}/", "")
    assert "input-bound" in answer, answer
    console = Console(record=True, width=110)
    console.print(Text(answer), soft_wrap=False)
    title = "the end of fit: the README's quick start model and data (1 epoch of 384 samples), on a CPU"
    console.save_svg(str(IMAGES / "end-of-fit.svg"), title=title)
    return Path(trainer.log_dir)


def main() -> int:
    IMAGES.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        run = end_of_fit(Path(tmp))
        return cli(["report", str(run), "--png", str(IMAGES / "report.png")])


if __name__ == "__main__":
    sys.exit(main())
