"""The winner of a command's tune in the project's own terms, from what its diagnosis round saw.

* A **LightningCLI** project (a LightningCLI script, or ``tune --config``, which runs our CLI entry with it):
  ``CFG.tuned.yaml`` beside the config it ran with, each setting under the key that feeds it
  (``data.init_args.num_workers``, ``trainer.precision``; a config key of the candidate as it is).
* A **Hydra** app: the override strings (``data.num_workers=4``; ``+trainer.benchmark=true`` for a key its
  config lacks) and a tuned config group file (``<group>/<choice>_tuned.yaml`` under the experiment folder, the
  chosen option with the changes on top), used by ``hydra.searchpath`` and the group's new choice.
* **Settings made in code**: the file and line that builds the DataLoader or the Trainer, with the keyword to
  change; for a compute setting the line that calls ``Trainer.fit`` (``model = torch.compile(model)``), the
  script's top (``torch.set_float32_matmul_precision("high")``) or the optimizer's (``fused=True``).

A datamodule argument that feeds a DataLoader setting under another name (``workers``) is found by what the run
built: its value equals the one seen on the DataLoader and its name says what it is (it holds ``worker``).

Pure: reads the facts (JSON) and writes YAML; imports no Lightning.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from lightning_perf.trial.compute.settings import COMPUTE_SETTINGS, code_lines
from lightning_perf.trial.project.command import LOADER_SETTINGS, TRAINER_SETTINGS
from lightning_perf.trial.project.library_terms import library_lines
from lightning_perf.trial.proposals import value_text
from lightning_perf.trial.tuned_config import write_tuned

# what an argument's name holds when it feeds a DataLoader setting under another name
NAME_HINTS = {
    "num_workers": "worker",
    "pin_memory": "pin",
    "persistent_workers": "persist",
    "prefetch_factor": "prefetch",
}
HYDRA_DIRNAME = "hydra_configs"


@dataclass
class InProjectTerms:
    """Where and how to set the winner: ``lines`` as people read them, the files written."""

    kind: str  # "lightning_cli", "hydra" or "code"
    lines: list[str] = field(default_factory=list)
    tuned_path: str | None = None
    diff: str = ""
    overrides: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "lines": list(self.lines),
            "tuned_config": self.tuned_path,
            "overrides": list(self.overrides),
            "files": list(self.files),
        }


def argument_for(setting: str, seen: Any, arguments: dict[str, Any]) -> str | None:
    """The argument that sets ``setting``: its own name, else the one argument whose name holds the setting's
    hint and whose value is the one seen on the DataLoader (``workers=0`` fed ``num_workers=0``)."""
    if setting in arguments:
        return setting
    hint = NAME_HINTS.get(setting)
    if hint is None or seen is None:
        return None
    found = [
        name
        for name, value in arguments.items()
        if hint in name.lower() and type(value) is type(seen) and value == seen
    ]
    return found[0] if len(found) == 1 else None


def in_project_terms(
    facts: dict[str, Any], changes: dict[str, Any], experiment_dir: str, overwrite: bool = False
) -> InProjectTerms:
    """Write the winner's ``changes`` (tune's setting names) the way the project sets them."""
    if facts.get("cli"):
        return _lightning_cli(facts, changes, overwrite)
    if facts.get("hydra"):
        return _hydra(facts, changes, experiment_dir)
    if (library := library_lines(facts, changes)) is not None:  # a library built the DataLoader
        return InProjectTerms("code", library[0] + _code_lines(facts, library[1]))
    return InProjectTerms("code", _code_lines(facts, changes))


def _seen(facts: dict[str, Any]) -> dict[str, Any]:
    loaders = facts.get("loaders") or []
    return loaders[0] if loaders else {}


def _lightning_cli(facts: dict[str, Any], changes: dict[str, Any], overwrite: bool) -> InProjectTerms:
    cli, seen = facts["cli"], _seen(facts)
    keyed: dict[str, Any] = {}
    left: dict[str, Any] = {}
    for key, value in changes.items():
        if "." in key:  # a config key already (a --variant's, a config's batch size or recipe switch)
            keyed[key] = value
            continue
        if key in TRAINER_SETTINGS:
            keyed[f"trainer.{key}"] = value
            continue
        for section in ("data", "model"):  # the datamodule's argument wins over the model's
            part = cli["sections"].get(section)
            name = argument_for(key, seen.get(key), part["args"]) if part else None
            if name is not None:
                keyed[part["prefix"] + name] = value
                break
        else:
            left[key] = value
    result = InProjectTerms("lightning_cli", _code_lines(facts, left))
    if keyed and cli.get("configs"):
        config = cli["configs"][-1]  # the last config given wins in the CLI: the tuned copy replaces it
        result.tuned_path, result.diff = write_tuned(config, keyed, overwrite)
        result.files.append(result.tuned_path)
        result.lines.insert(
            0, f"{result.tuned_path}: {', '.join(f'{k}: {value_text(v)}' for k, v in keyed.items())}"
        )
    return result


def _hydra(facts: dict[str, Any], changes: dict[str, Any], experiment_dir: str) -> InProjectTerms:
    hydra, seen = facts["hydra"], _seen(facts)
    nodes = hydra.get("nodes", {})
    by_group: dict[str, dict[str, Any]] = {}
    result = InProjectTerms("hydra")
    left: dict[str, Any] = {}
    for key, value in changes.items():
        role = "trainer" if key in TRAINER_SETTINGS else "data"
        node = nodes.get(role) if key not in COMPUTE_SETTINGS else None  # set in code
        name = (
            key if role == "trainer" else (argument_for(key, seen.get(key), node["keys"]) if node else None)
        )
        if node is None or name is None:
            left[key] = value
            continue
        present = name in node["keys"]
        result.overrides.append(f"{'' if present else '+'}{node['path']}.{name}={_hydra_value(value)}")
        by_group.setdefault(node["path"], {})[name] = value
    if result.overrides:
        result.lines.append("run with the overrides: " + " ".join(result.overrides))
    for path, keys in by_group.items():
        written = _group_file(hydra, path, keys, experiment_dir)
        if written is not None:
            result.files.append(written[0])
            result.lines.append(written[1])
    result.lines += _code_lines(facts, left)
    return result


def _hydra_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value_text(value)


def _group_file(
    hydra: dict[str, Any], path: str, keys: dict[str, Any], experiment_dir: str
) -> tuple[str, str] | None:
    """``<experiment>/hydra_configs/<group>/<choice>_tuned.yaml``: the option the run chose, with ``keys`` on
    top; None when the node is not a config group's (no choice of that name)."""
    import yaml

    choice = hydra.get("choices", {}).get(path)
    if not choice or "." in path:
        return None
    root = os.path.abspath(os.path.join(experiment_dir, HYDRA_DIRNAME))
    target = os.path.join(root, path, f"{choice}_tuned.yaml")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    body = yaml.safe_dump({"defaults": [choice, "_self_"], **keys}, sort_keys=False, default_flow_style=False)
    with open(target, "w", encoding="utf-8") as fh:
        fh.write(
            f"# lightning-perf tune: the {path} option {choice!r} with the measured winner on top\n{body}"
        )
    usage = f"or use {target}: add hydra.searchpath=[file://{root}] {path}={choice}_tuned to your command"
    return target, usage


def _python(value: Any) -> str:
    """A value as Python code: ``"bf16-mixed"``, ``True``, ``4``."""
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _code_lines(facts: dict[str, Any], changes: dict[str, Any]) -> list[str]:
    """Settings made in code: the line that builds the DataLoader or Trainer, the keyword to change; a
    datamodule argument that feeds a loader setting under its own name is named."""
    lines = []
    seen = _seen(facts)
    datamodule = facts.get("datamodule") or {}
    for key, value in changes.items():
        if key in COMPUTE_SETTINGS:
            lines += code_lines(facts, {key: value})
        elif key in LOADER_SETTINGS:
            name = argument_for(key, seen.get(key), datamodule.get("args") or {})
            if name is not None and name != key:
                where = datamodule.get("site") or datamodule.get("class")
                lines.append(
                    f"{where}: the datamodule's argument {name} feeds the DataLoader's {key}: set {name}={value_text(value)}"
                )
                continue
            site = seen.get("site") or "the code that builds the training DataLoader"
            lines.append(f"{site}: the DataLoader built here: set {key}={value_text(value)}")
        else:
            site = facts.get("trainer_site") or "the code that builds the Trainer"
            lines.append(f"{site}: the Trainer built here: set {key}={_python(value)}")
    return lines
