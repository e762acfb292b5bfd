"""A round's DataLoader settings applied to the training DataLoader(s) the fit actually builds.

Lightning prepares every DataLoader of a stage in ``_DataConnector._prepare_dataloader`` (where it injects a
distributed sampler by re-creating the loader from the arguments it was built with: ``_update_dataloader``). The
wrapper here lets Lightning prepare the training loader, records what the project built (its settings and the
file and line that built it), then re-creates it the same way with the round's settings, so a DataLoader
subclass, a custom sampler or batch sampler keep their own arguments. Should that fail (a loader whose
arguments cannot be recovered), the settings are set on the loader itself: they are read when its iterator
starts.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from lightning_perf import console
from lightning_perf.trial.project.command import LOADER_SETTINGS

log = console.logger(__name__)
SITE_ATTRIBUTE = "_lightning_perf_site"
TRAINING = "train"  # RunningStage.TRAINING's value


def wrap_prepare_dataloader(namespace: Any, run: Any) -> None:
    connector_module = importlib.import_module(f"{namespace.__name__}.trainer.connectors.data_connector")
    data_utils = importlib.import_module(f"{namespace.__name__}.utilities.data")
    connector = connector_module._DataConnector
    original = connector._prepare_dataloader

    @functools.wraps(original)
    def _prepare_dataloader(self: Any, dataloader: object, *args: Any, **kwargs: Any) -> object:
        prepared = original(self, dataloader, *args, **kwargs)
        mode = kwargs.get("mode", args[1] if len(args) > 1 else None)
        if getattr(mode, "value", mode) != TRAINING:
            return prepared
        return apply_settings(prepared, run, data_utils, mode)

    connector._prepare_dataloader = _prepare_dataloader


def loader_facts(loader: Any) -> dict[str, Any]:
    """What the project built: the settings, the batch size, its class and where it was built."""
    facts = {key: getattr(loader, key, None) for key in LOADER_SETTINGS}
    facts["batch_size"] = getattr(loader, "batch_size", None)
    facts["class"] = f"{type(loader).__module__}.{type(loader).__qualname__}"
    facts["site"] = loader.__dict__.get(SITE_ATTRIBUTE)
    return facts


def apply_settings(loader: Any, run: Any, data_utils: Any, mode: Any) -> Any:
    from torch.utils.data import DataLoader

    if not isinstance(loader, DataLoader):
        return loader
    facts = loader_facts(loader)
    run.loaders.append(facts)
    wanted = {k: v for k, v in run.settings.items() if k in LOADER_SETTINGS}
    if all(facts[k] == v for k, v in wanted.items()):
        return loader
    settings = {**{k: facts[k] for k in LOADER_SETTINGS}, **wanted}
    if not settings["num_workers"]:  # the DataLoader refuses these without workers
        settings["prefetch_factor"], settings["persistent_workers"] = None, False
    try:
        args, kwargs = data_utils._get_dataloader_init_args_and_kwargs(loader, loader.sampler, mode)
        args, kwargs = _replaced(loader, list(args), dict(kwargs), settings)
        rebuilt = data_utils._reinstantiate_wrapped_cls(loader, *args, **kwargs)
    except Exception as err:  # arguments Lightning cannot recover: set them on the loader itself
        log.info(
            "lightning-perf: the DataLoader could not be re-created (%s); its settings are set on it", err
        )
        for key, value in settings.items():
            object.__setattr__(loader, key, value)
        return loader
    rebuilt.__dict__[SITE_ATTRIBUTE] = facts["site"]
    return rebuilt


def _replaced(
    loader: Any, args: list[Any], kwargs: dict[str, Any], settings: dict[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """The constructor arguments with each setting replaced where it was given (by position or by name)."""
    names = list(getattr(loader, "__pl_saved_arg_names", ()))
    for key, value in settings.items():
        if key in names[: len(args)]:
            args[names.index(key)] = value
        else:
            kwargs[key] = value
    return args, kwargs
