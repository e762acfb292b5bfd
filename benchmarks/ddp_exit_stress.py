"""Does a ``ddp_spawn`` rank abort at exit after a fit with PerfCallback? Runs many short fits and counts.

CI once saw a spawned rank print "terminate called without an active exception" and die of SIGABRT after its
fit and summary were written: a ``std::thread`` of a gloo process group still joinable when the interpreter
exits (pytorch/pytorch#190489). Since then ``RankReducer.close()`` destroys our own cross-rank group in
``teardown``. This script checks that fix where it matters, in fresh processes:

* each run is a fresh interpreter doing one 2-rank CPU ``ddp_spawn`` fit (gloo) of a tiny model, with a
  profiled cycle and the cross-rank gathers, 16 steps;
* a run aborts when the fit's process exits non-zero or any rank printed "terminate called";
* ``--without-close`` turns ``RankReducer.close`` into a no-op, the code before the fix, for comparison.

    python benchmarks/ddp_exit_stress.py [--runs 20] [--without-close]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

ONE_FIT = r"""
import os, sys, tempfile, time
import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset
from lightning_perf import PerfCallback
from lightning_perf.collect.rank_exchange import RankReducer

if os.environ.get("STRESS_WITHOUT_CLOSE"):
    RankReducer.close = lambda self: None


class Slow(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.randn(8), torch.randn(1)


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    callback = PerfCallback(skip_first=2, wait=1, warmup=1, active=2, probe_num_workers="never")
    trainer = L.Trainer(
        default_root_dir=sys.argv[1], accelerator="cpu", devices=2, strategy="ddp_spawn", max_epochs=1,
        callbacks=[callback], enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        log_every_n_steps=4,
    )
    trainer.fit(Tiny(), DataLoader(Slow(), batch_size=4))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--without-close", action="store_true", help="the code before the fix")
    args = parser.parse_args()
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    if args.without_close:
        env["STRESS_WITHOUT_CLOSE"] = "1"
    aborted, started = [], time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        script = os.path.join(scratch, "one_fit.py")
        with open(script, "w", encoding="utf-8") as handle:
            handle.write(ONE_FIT)
        for run in range(1, args.runs + 1):
            done = subprocess.run(
                [sys.executable, script, os.path.join(scratch, f"run{run}")],
                env=env,
                capture_output=True,
                text=True,
            )
            output = done.stdout + done.stderr
            if done.returncode != 0 or "terminate called" in output:
                aborted.append(run)
                tail = "\n    ".join(output.strip().splitlines()[-6:])
                print(f"run {run}: exit {done.returncode}\n    {tail}")
    side = "without RankReducer.close (before the fix)" if args.without_close else "as shipped"
    print(
        f"{side}: {len(aborted)} of {args.runs} runs aborted at exit "
        f"({time.perf_counter() - started:.0f} s){': runs ' + str(aborted) if aborted else ''}"
    )


if __name__ == "__main__":
    main()
