"""Starting the utilization sampler for a Trainer: which GPU is the rank's, which processes are not workers.

Kept out of the callback so its hooks stay a thin list; a failure here turns sampling off with one warning and
never stops training.
"""

from __future__ import annotations

from typing import Any

from lightning_perf import console

log = console.logger(__name__)


def start_for(trainer: Any, interval_s: float) -> Any:
    """A started, paused :class:`~lightning_perf.collect.sampling.utilization.UtilSampler` for ``trainer``, or None."""
    try:
        from lightning_perf.collect.sampling.memory_trend import MemoryRecorder
        from lightning_perf.collect.sampling.utilization import UtilSampler

        device = trainer.strategy.root_device
        cuda_devices = [device.index or 0] if device.type == "cuda" else []
        # under strategy="ddp" rank 0 launched the other local ranks: they are not DataLoader workers
        launcher = getattr(trainer.strategy, "launcher", None)
        other_ranks = [proc.pid for proc in getattr(launcher, "procs", None) or []]
        memory = MemoryRecorder(lambda: trainer.global_step, cuda_devices[0] if cuda_devices else None)
        sampler = UtilSampler(interval_s, cuda_devices, exclude_pids=other_ranks, memory=memory)
        sampler.pause()  # the first epoch's start is not a step: the first batch resumes it
        sampler.start()
        return sampler
    except Exception as err:
        log.warning(f"lightning-perf: utilization sampling is off: {err}")
        return None
