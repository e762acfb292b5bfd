"""The settings fingerprint of a run, read off the Trainer, the model and the training DataLoader."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader

from lightning_perf.analysis.numbers import finite, is_number
from lightning_perf.analysis.summary import Settings
from lightning_perf.collect.sampling.cpu_sampler import usable_cpu_count


def train_dataloader(trainer: Any) -> DataLoader | None:
    """The first training DataLoader of the running fit, from the public ``trainer.train_dataloader`` (the
    loaders as the user returned them: one, or a list or dict of them)."""
    try:
        return _first_dataloader(trainer.train_dataloader)
    except AttributeError:  # a Lightning version whose property reads a renamed internal
        return None


def _first_dataloader(loaders: Any, depth: int = 0) -> DataLoader | None:
    if isinstance(loaders, DataLoader):
        return loaders
    if isinstance(loaders, Mapping):
        loaders = list(loaders.values())
    if depth < 3 and isinstance(loaders, (list, tuple)):
        for item in loaders:
            if (found := _first_dataloader(item, depth + 1)) is not None:
                return found
    return None


def model_has_conv(module: torch.nn.Module | None) -> bool | None:
    if module is None:
        return None
    return any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in module.modules())


def _whole(value: Any) -> int | None:
    number = finite(value)  # num_training_batches is inf for a loader without a length
    return None if number is None else int(number)


def _validation_settings(trainer: Any, settings: Settings) -> None:
    """How often validation runs (and for how many epochs), as the user set it on the Trainer."""
    interval = getattr(trainer, "val_check_interval", None)
    settings.val_check_interval = interval if is_number(interval) else None
    settings.check_val_every_n_epoch = _whole(getattr(trainer, "check_val_every_n_epoch", None))
    limit = getattr(trainer, "limit_val_batches", None)
    settings.limit_val_batches = limit if is_number(limit) else None
    settings.max_epochs = _whole(getattr(trainer, "max_epochs", None))
    settings.train_batches_per_epoch = _whole(getattr(trainer, "num_training_batches", None))


def collect_settings(
    trainer: Any,
    dataloader: DataLoader | None,
    batch_size: int | None = None,
    input_shapes_vary: bool | None = None,
    loader_yields_cuda: bool | None = None,
) -> Settings:
    from lightning_perf.collect.namespaces import lightning_version

    device = trainer.strategy.root_device
    settings = Settings(
        batch_size=batch_size,
        cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
        cudnn_deterministic=bool(torch.backends.cudnn.deterministic),
        precision=str(trainer.precision),
        accelerator=device.type,
        devices=int(trainer.num_devices),
        world_size=int(trainer.world_size),
        strategy=getattr(trainer.strategy, "strategy_name", type(trainer.strategy).__name__),
        accumulate_grad_batches=int(trainer.accumulate_grad_batches),
        torch_version=torch.__version__,
        lightning_version=lightning_version(trainer),
        cuda_version=torch.version.cuda,
        cpu_count=usable_cpu_count(),
        host=socket.gethostname(),
        model_has_conv=model_has_conv(trainer.lightning_module),
        input_shapes_vary=input_shapes_vary,
        float32_matmul_precision=torch.get_float32_matmul_precision(),
        matmul_allow_tf32=bool(torch.backends.cuda.matmul.allow_tf32),
        cudnn_allow_tf32=bool(torch.backends.cudnn.allow_tf32),
        loader_yields_cuda=loader_yields_cuda,
    )
    _validation_settings(trainer, settings)
    if device.type == "cuda":
        settings.gpu_name = torch.cuda.get_device_name(device)
        # from torch, so the precision advice holds with NVML off (and on a MIG instance)
        settings.compute_capability = list(torch.cuda.get_device_capability(device))
    if dataloader is not None:
        settings.num_workers = dataloader.num_workers
        settings.pin_memory = bool(dataloader.pin_memory)
        settings.persistent_workers = bool(dataloader.persistent_workers)
        settings.prefetch_factor = dataloader.prefetch_factor if dataloader.num_workers > 0 else None
        if dataloader.batch_size is not None:
            settings.batch_size = dataloader.batch_size
        elif dataloader.batch_sampler is not None and hasattr(dataloader.batch_sampler, "batch_size"):
            settings.batch_size = dataloader.batch_sampler.batch_size
    return settings
