"""What a command's diagnosis round saw of the project, for naming the winner in the project's own terms.

Written as JSON at the end of the round's fit (:mod:`lightning_perf.trial.project.inject`), read by the parent
(:mod:`lightning_perf.trial.project.terms`, which imports no Lightning):

* ``loaders``: each training DataLoader's settings as the project built it, and the file and line that built it;
* ``trainer_site``: the file and line that built the Trainer;
* ``cli``: a LightningCLI's config files, and for its ``data`` and ``model`` sections the config key prefix, the
  ``__init__`` arguments' names and the value of each;
* ``hydra``: a Hydra app's config folder, its group choices, the overrides it ran with, and the composed config's
  nodes that built the Trainer and the datamodule (their path and keys);
* ``datamodule``: its class, where it is defined, and its ``__init__`` arguments' values (from ``hparams`` or
  attributes of the same name);
* ``compute``: the script, the line that called ``Trainer.fit``, the model's class and each optimizer's, and how
  it can step (fused or foreach), for the compute settings.

Only plain values (numbers, strings, booleans, None) are kept.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
from typing import Any

from lightning_perf.atomic_file import atomic_open
from lightning_perf.trial.compute.apply import compute_facts

PLAIN = (int, float, bool, str, type(None))
MISSING = object()


def _parameters(obj: Any) -> set[str]:
    """The ``__init__`` argument names of ``obj``'s class."""
    if obj is None:
        return set()
    try:
        return set(inspect.signature(type(obj).__init__).parameters) - {"self", "args", "kwargs"}
    except (TypeError, ValueError):
        return set()


def _prefix(config: Any, section: str) -> str:
    """``data.init_args.`` when the section is given by class_path, else ``data.``."""
    value = _value(config, section)
    has_class_path = value is not None and getattr(value, "class_path", None) is not None
    return f"{section}.init_args." if has_class_path else f"{section}."


def _value(config: Any, key: str) -> Any:
    try:
        return config.get(key)
    except (AttributeError, KeyError, TypeError):
        return None


def write_facts(path: str, run: Any, trainer: Any) -> None:
    datamodule = getattr(trainer, "datamodule", None)
    facts = {
        "loaders": [{k: v for k, v in f.items() if isinstance(v, PLAIN)} for f in run.loaders],
        "trainer_site": run.trainer_site,
        "cli": cli_facts(run.cli),
        "hydra": hydra_facts(trainer, datamodule),
        "datamodule": object_facts(datamodule),
        "argv": list(sys.argv),
        "compute": compute_facts(run, trainer),
    }
    with atomic_open(path) as fh:
        json.dump(facts, fh, indent=2, default=repr)
        fh.write("\n")


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not MISSING and isinstance(v, PLAIN)}


def cli_facts(cli: Any) -> dict[str, Any] | None:
    if cli is None:
        return None
    config, model, datamodule = cli
    paths = []
    for item in (_value(config, "config") or []) if config is not None else []:
        path = getattr(item, "absolute", None) or str(item)
        paths.append(os.path.abspath(str(path)))
    sections = {}
    for section, obj in (("data", datamodule), ("model", model)):
        if obj is None:
            continue
        prefix = _prefix(config, section)
        names = _parameters(obj)
        sections[section] = {
            "prefix": prefix,
            "names": sorted(names),
            "args": _plain({name: _value(config, prefix + name) for name in names}),
        }
    return {"configs": paths, "sections": sections}


def object_facts(obj: Any) -> dict[str, Any] | None:
    """A datamodule's class, definition site and argument values."""
    if obj is None:
        return None
    cls = type(obj)
    try:
        site = f"{os.path.abspath(inspect.getsourcefile(cls) or '')}:{inspect.getsourcelines(cls)[1]}"
    except (OSError, TypeError):
        site = None
    hparams = getattr(obj, "hparams", None) or {}
    values = {}
    for name in _parameters(obj):
        if name in hparams:
            values[name] = hparams[name]
        else:
            values[name] = getattr(obj, name, getattr(obj, f"_{name}", MISSING))
    return {"class": f"{cls.__module__}.{cls.__qualname__}", "site": site, "args": _plain(values)}


def hydra_facts(trainer: Any, datamodule: Any) -> dict[str, Any] | None:
    """A Hydra app's config folder, choices, overrides and the nodes that built the Trainer and datamodule."""
    if "hydra" not in sys.modules:
        return None
    try:
        from hydra.core.hydra_config import HydraConfig
        from omegaconf import OmegaConf
    except ImportError:
        return None
    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    config_dir = next(
        (s.path for s in hc.runtime.config_sources if s.provider == "main" and s.schema == "file"), None
    )
    composed = None
    if hc.output_subdir:
        saved = os.path.join(hc.runtime.output_dir, hc.output_subdir, "config.yaml")
        if os.path.isfile(saved):
            composed = OmegaConf.to_container(OmegaConf.load(saved), resolve=False)
    nodes = {}
    for role, obj in (("trainer", trainer), ("data", datamodule)):
        found = _node_of(composed, type(obj)) if obj is not None and composed is not None else None
        if found is not None:
            path, node = found
            nodes[role] = {"path": path, "keys": _plain({k: v for k, v in node.items() if k != "_target_"})}
    choices = OmegaConf.to_container(hc.runtime.choices)  # a dict: the choices are a DictConfig
    return {
        "config_dir": config_dir,
        "config_name": hc.job.config_name,
        "choices": {k: v for k, v in choices.items() if isinstance(v, str)}
        if isinstance(choices, dict)
        else {},
        "overrides": list(hc.overrides.task),
        "nodes": nodes,
    }


def _node_of(config: Any, cls: type, path: str = "") -> tuple[str, dict[str, Any]] | None:
    """The path and node of the composed config whose ``_target_`` is ``cls`` (depth first)."""
    if not isinstance(config, dict):
        return None
    target = config.get("_target_")
    if isinstance(target, str) and path:
        try:
            from hydra.utils import get_class

            if get_class(target) is cls:
                return path, config
        except Exception:
            pass
    for key, value in config.items():
        found = _node_of(value, cls, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None
