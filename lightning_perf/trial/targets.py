"""Where a Lightning CLI config can set each setting ``lightning-perf tune`` may change (read in the worker).

The DataLoader's arguments (``num_workers``, ``pin_memory``, ...) are in the config only when the user's
datamodule (or model, for dataloaders it builds) takes them as ``__init__`` arguments; their config key is
``data.init_args.<name>`` for classes given by ``class_path`` and ``data.<name>`` for a CLI with fixed classes.
A model with a ``compile`` argument exposes ``torch.compile``. A named recipe of the diagnosis (code the project
must have, e.g. ``batched_transforms``) is in the config when the model or datamodule takes an argument of that
name: the project has the code and switches it on there. Written as JSON for the parent, which imports no
Lightning.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from lightning_perf.atomic_file import atomic_open

LOADER_KEYS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "batch_size")
COMPILE_ARGUMENT = "compile"
# the diagnosis's named recipes (analysis.rules.thresholds.SETTING_TARGETS: "LightningModule"), switched on by a
# boolean argument of the same name where the project has the code
RECIPE_ARGUMENTS = ("batched_transforms",)


def _parameters(obj: Any) -> set[str]:
    if obj is None:
        return set()
    try:
        return set(inspect.signature(type(obj).__init__).parameters) - {"self"}
    except (TypeError, ValueError):
        return set()


def _prefix(config: Any, section: str) -> str:
    """``data.init_args.`` when the section is given by class_path, else ``data.``."""
    try:
        value = config.get(section)
    except (AttributeError, KeyError):
        value = None
    has_class_path = value is not None and getattr(value, "class_path", None) is not None
    return f"{section}.init_args." if has_class_path else f"{section}."


def _value(config: Any, key: str) -> Any:
    try:
        return config.get(key)
    except (AttributeError, KeyError, TypeError):
        return None


def describe(config: Any, model: Any, datamodule: Any) -> dict[str, Any]:
    """The config keys of the tunable settings, from the CLI's parsed ``config`` and its instances."""
    loader_keys: dict[str, str] = {}
    for section, obj in (("model", model), ("data", datamodule)):  # the datamodule's win over the model's
        names = _parameters(obj)
        for key in LOADER_KEYS:
            if key in names:
                loader_keys[key] = _prefix(config, section) + key
    compile_key = (
        _prefix(config, "model") + COMPILE_ARGUMENT if COMPILE_ARGUMENT in _parameters(model) else None
    )
    recipes = {
        name: [_prefix(config, section) + name for section, obj in (("model", model), ("data", datamodule))]
        for name in RECIPE_ARGUMENTS
    }
    for name in RECIPE_ARGUMENTS:
        takes = {"model": name in _parameters(model), "data": name in _parameters(datamodule)}
        recipes[name] = [key for key in recipes[name] if takes[key.split(".")[0]]]
    return {
        "loader_keys": loader_keys,
        "recipes": {name: keys for name, keys in recipes.items() if keys},
        "compile": compile_key,
        "compile_on": bool(_value(config, compile_key)) if compile_key else False,
    }


def write(path: str, config: Any, model: Any, datamodule: Any) -> None:
    with atomic_open(path) as fh:
        json.dump(describe(config, model, datamodule), fh, indent=2)
        fh.write("\n")
