"""A tiny DDP fit run as a script by the launcher tests: ``python -m tests.launchers.fit_script --root DIR ...``.

Lightning's subprocess launcher (``strategy="ddp"``) re-executes this command line for every other rank, and
``torchrun`` starts it once per rank; either way each rank writes what it measured (``callback.last_summary``)
to ``<root>/summaries/rank<N>.json``, however the fit ends, so the tests can read every rank's summary.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import time

import lightning as L
from torch.utils.data import DataLoader

from lightning_perf import PerfCallback
from tests.ddp_models import RankSlowedDataset, rank
from tests.helpers import TinyModel


class ScriptedModel(TinyModel):
    """Sleeps a little each step; rank ``kill_rank`` SIGKILLs itself at global step ``kill_at``; every rank gets
    SIGTERM at global step ``sigterm_at``.

    Each rank signals itself at the same step, so every rank's Python handler runs at the same point of the loop.
    Lightning's SIGTERM handler broadcasts from inside the signal handler: sent from outside at a random moment,
    one try in seven had rank 0 stop while rank 1 was in its next all-reduce (which failed, "Connection closed by
    peer"), and node 0's torchrun agent then waited 300 s in its exit barrier; a CI test must not depend on that.
    """

    def __init__(self, step_sleep_s: float, kill_rank: int, kill_at: int, sigterm_at: int) -> None:
        super().__init__()
        self.step_sleep_s = step_sleep_s
        self.kill_rank = kill_rank
        self.kill_at = kill_at
        self.sigterm_at = sigterm_at

    def training_step(self, batch, batch_idx):
        step = self.trainer.global_step
        if rank() == self.kill_rank and step >= self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # no goodbye: a node lost, an OOM killer
        if step == self.sigterm_at:
            os.kill(os.getpid(), signal.SIGTERM)  # as a cluster scheduler does before preemption
        if self.step_sleep_s:
            time.sleep(self.step_sleep_s)
        return super().training_step(batch, batch_idx)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--trace-ranks", default='"auto"', help="JSON: a word or a list of ranks")
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--delay-s", type=float, default=0.0, help="the slow rank's sleep per sample")
    parser.add_argument("--samples", type=int, default=96, help="samples per rank and epoch")
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--step-sleep-s", type=float, default=0.0)
    parser.add_argument("--kill-rank", type=int, default=-1)
    parser.add_argument("--kill-at", type=int, default=-1)
    parser.add_argument("--sigterm-at", type=int, default=-1)
    parser.add_argument("--ckpt-every", type=int, default=0)
    parser.add_argument("--resume", default=None)
    args = parser.parse_args()
    faulthandler.register(signal.SIGUSR2, all_threads=True)  # a stuck rank's stacks, on request (debugging)

    callback = PerfCallback(
        skip_first=2,
        wait=1,
        warmup=1,
        active=2,
        repeat=0,
        probe_num_workers="never",
        log_min_interval_s=0,
        ab_cudnn_benchmark=False,
        log_hparams=False,
        trace_ranks=json.loads(args.trace_ranks),
    )
    callbacks: list = [callback]
    if args.ckpt_every:
        callbacks.append(
            L.pytorch.callbacks.ModelCheckpoint(
                dirpath=os.path.join(args.root, "ckpt"), save_last=True, every_n_train_steps=args.ckpt_every
            )
        )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        num_nodes=args.num_nodes,
        strategy="ddp",
        default_root_dir=args.root,
        max_epochs=-1 if args.max_steps > 0 else 1,
        max_steps=args.max_steps,
        log_every_n_steps=4,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(args.ckpt_every),
        num_sanity_val_steps=0,
        callbacks=callbacks,
    )
    # DistributedSampler gives each rank samples/world_size: ask for `samples` per rank
    data = DataLoader(
        RankSlowedDataset(
            n=args.samples * trainer.world_size, slow_rank=args.slow_rank, delay_s=args.delay_s
        ),
        batch_size=4,
    )
    model = ScriptedModel(args.step_sleep_s, args.kill_rank, args.kill_at, args.sigterm_at)
    try:
        trainer.fit(model, data, ckpt_path=args.resume)
    finally:
        summary = callback.last_summary
        if summary is not None:
            folder = os.path.join(args.root, "summaries")
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"rank{trainer.global_rank}.json")
            summary.save(path)


if __name__ == "__main__":
    main()
