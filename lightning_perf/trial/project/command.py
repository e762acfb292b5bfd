"""Rounds of the user's own training command (``lightning-perf tune/trial -- COMMAND ARGS...``).

The command runs as the user runs it (``python train.py``, a Hydra app with its overrides, a LightningCLI script
with ``fit --config ...``); a ``sitecustomize`` of ours, first on its PYTHONPATH, applies the round's settings
inside it at run time (:mod:`lightning_perf.trial.project.inject`), so no config key needs to be known. The settings
are tune's own names (:data:`RUNTIME_SETTINGS`); where the project sets them is found by what the run built and
named afterwards (:mod:`lightning_perf.trial.project.terms`).

Pure standard library (and YAML for values): the parent never imports Lightning.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from collections.abc import Sequence
from typing import Any

from lightning_perf.trial.compute.settings import COMPUTE_SETTINGS, check_value
from lightning_perf.trial.runner import RoundLimits, RoundReport, run_worker, worker_env
from lightning_perf.trial.spec import TrialError
from lightning_perf.yaml_budget import YamlBudgetError, load_yaml, shortened_repr

# the environment variable that carries a round's spec into the command (read by lightning_perf.trial.project.inject)
RUN_ENV = "LIGHTNING_PERF_RUN"
# the DataLoader settings a round applies to the training DataLoader(s) the fit builds
LOADER_SETTINGS = ("num_workers", "persistent_workers", "pin_memory", "prefetch_factor")
# the Trainer settings a round applies to every Trainer the command builds
TRAINER_SETTINGS = ("precision", "benchmark")
# the compute settings a round applies to the model and its optimizers (lightning_perf.trial.compute)
RUNTIME_SETTINGS = LOADER_SETTINGS + TRAINER_SETTINGS + COMPUTE_SETTINGS
# where the candidates of a command's tune set each setting: the setting's own name (see proposals.config_key)
RUNTIME_TARGETS: dict[str, Any] = {
    "loader_keys": {key: key for key in LOADER_SETTINGS},
    "trainer_keys": {key: key for key in TRAINER_SETTINGS},
    "compute_keys": {key: key for key in COMPUTE_SETTINGS},
    "recipes": {},
    "compile": None,
}
FACTS_FILENAME = "tune_facts.json"
# the command ``tune/trial --config CFG.yaml`` runs: the Lightning CLI built with the config
# (:mod:`lightning_perf.trial.project.cli_main`); ``--cli`` is its first argument
CLI_MAIN_MODULE = "lightning_perf.trial.project.cli_main"
CLI_FLAG = "--lightning-perf-cli"
# a config's model or datamodule argument of one of these names switches on the diagnosis's named recipe
# (analysis.rules.thresholds.SETTING_TARGETS: "LightningModule"): the project has the code, the config the switch
RECIPE_ARGUMENTS = ("batched_transforms",)
COMPILE_ARGUMENT = "compile"
SITE_DIRNAME = "_site"
COMMAND_LOG_FILENAME = "command.log"

# The bootstrap: Python runs `sitecustomize` at start-up from the first folder on sys.path that has one. Ours
# installs the run-time hooks (which do nothing until Lightning is imported), then runs the user's own
# sitecustomize, if any, so theirs is not shadowed. It must not stop an unrelated Python process of the command
# (a helper, a DataLoader worker started by spawn), so a failure to install is reported on the protocol: the
# round then fails with that message instead of measuring the project without its settings.
BOOTSTRAP = '''\
"""Written by lightning-perf for one tune/trial round: applies the round's settings (lightning_perf.trial.project.inject)."""
import importlib.machinery
import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
try:
    from lightning_perf.trial.project.inject import install
except ImportError as _err:
    print(
        f"@@lightning-perf-trial@@ error the command's Python ({sys.executable}) cannot import lightning_perf "
        f"({_err}): run the command with the Python where lightning-perf is installed, or install it there",
        flush=True,
    )
    os._exit(1)
try:
    install()
except Exception as _err:
    print(f"@@lightning-perf-trial@@ error could not apply the round's settings: {_err!r}", flush=True)
    os._exit(1)
_path = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _path)
if _spec is not None and _spec.loader is not None:
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
'''


def config_command(configs: Sequence[str], cli: str | None = None) -> list[str]:
    """The command of ``--config CFG.yaml`` (repeatable) and ``--cli MODULE:ATTR``: our Lightning CLI entry."""
    import sys

    command = [sys.executable, "-m", CLI_MAIN_MODULE]
    command += [f"{CLI_FLAG}={cli}"] if cli is not None else []
    return command + [arg for path in configs for arg in ("--config", path)]


def split_overrides(
    name: str, overrides: Sequence[tuple[str, str]], label: str, config_keys: bool = False
) -> tuple[dict[str, Any], list[str]]:
    """A variant's settings in tune's names (applied at run time) and, for a config's command (``config_keys``),
    its config keys (``data.init_args.batch_size=8``) as the CLI's arguments after the config."""
    if not config_keys:
        return parse_settings(name, overrides, label), []
    keyed = [(key, text) for key, text in overrides if "." in key]
    settings = parse_settings(name, [(k, t) for k, t in overrides if "." not in k], label, config_keys)
    return settings, [f"--{key}={text}" for key, text in keyed]


def cli_targets(cli: dict[str, Any] | None) -> dict[str, Any]:
    """Where a config's candidates set each setting: tune's names at run time (:data:`RUNTIME_TARGETS`), plus what
    only the config holds, from the diagnosis's facts of its CLI (:func:`lightning_perf.trial.project.facts.cli_facts`):
    the batch size's key, a recipe's switch, a model's ``compile`` argument."""
    targets = {
        name: dict(value) if isinstance(value, dict) else value for name, value in RUNTIME_TARGETS.items()
    }
    sections = (cli or {}).get("sections") or {}
    recipes: dict[str, list[str]] = {}
    for section in ("model", "data"):
        part = sections.get(section)
        if not part:
            continue
        names = set(part.get("names") or part.get("args") or {})
        if "batch_size" in names and (section == "data" or "batch_size" not in targets["loader_keys"]):
            targets["loader_keys"]["batch_size"] = part["prefix"] + "batch_size"
        for recipe in RECIPE_ARGUMENTS:
            if recipe in names:
                recipes.setdefault(recipe, []).append(part["prefix"] + recipe)
        if section == "model" and COMPILE_ARGUMENT in names:
            targets["compile"] = part["prefix"] + COMPILE_ARGUMENT
            targets["compile_on"] = bool((part.get("args") or {}).get(COMPILE_ARGUMENT))
            targets["compute_keys"].pop(COMPILE_ARGUMENT, None)  # the model compiles itself
    targets["recipes"] = recipes
    return targets


def parse_settings(
    name: str, overrides: Sequence[tuple[str, str]], label: str, config_keys: bool = False
) -> dict[str, Any]:
    """A command variant's settings in tune's names (``num_workers=4``), values read as YAML; bad names are
    refused naming the flag and the settings allowed."""
    import yaml

    settings: dict[str, Any] = {}
    for key, text in overrides:
        if key not in RUNTIME_SETTINGS and config_keys:
            raise TrialError(
                f"{label} {name!r}: {key!r} is neither a setting a round applies ({', '.join(RUNTIME_SETTINGS)}) "
                f"nor a config key (data.init_args.{key}=...)"
            )
        if key not in RUNTIME_SETTINGS:
            raise TrialError(
                f"{label} {name!r}: {key!r} is not a setting a round of a command can apply; use one of "
                f"{', '.join(RUNTIME_SETTINGS)} (e.g. {name}:num_workers=4 or {name}:compile=true)"
            )
        try:
            value = load_yaml(text, f"{label} {name!r}: the value of {key}")
        except YamlBudgetError as err:
            raise TrialError(str(err)) from None
        except yaml.YAMLError:
            value = text
        _check_value(name, key, value, label)
        settings[key] = value
    return settings


def _check_value(name: str, key: str, value: Any, label: str) -> None:
    if key == "num_workers" and not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        raise TrialError(
            f"{label} {name!r}: num_workers must be an integer >= 0, got {shortened_repr(value)}"
        )
    if key == "prefetch_factor" and not (
        value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1)
    ):
        raise TrialError(
            f"{label} {name!r}: prefetch_factor must be an integer >= 1 or null, got {shortened_repr(value)}"
        )
    if key in ("persistent_workers", "pin_memory", "benchmark") and not isinstance(value, bool):
        raise TrialError(f"{label} {name!r}: {key} must be true or false, got {shortened_repr(value)}")
    why = check_value(key, value)
    if why is not None:
        raise TrialError(f"{label} {name!r}: {why}")


def check_command(command: Sequence[str]) -> list[str]:
    """The command after ``--``: present, and its program found (on PATH or as a path)."""
    if not command:
        raise TrialError("-- COMMAND: give the training command after --, e.g. -- python train.py")
    program = command[0]
    if shutil.which(program) is None:
        raise TrialError(f"-- COMMAND: {program!r} is not found (not on PATH and not an executable file)")
    return list(command)


def command_text(command: Sequence[str]) -> str:
    return shlex.join(command)


def write_bootstrap(directory: str) -> str:
    """Write the ``sitecustomize.py`` bootstrap into ``directory``; returns the folder to put on PYTHONPATH."""
    site = os.path.join(directory, SITE_DIRNAME)
    os.makedirs(site, exist_ok=True)
    with open(os.path.join(site, "sitecustomize.py"), "w", encoding="utf-8") as fh:
        fh.write(BOOTSTRAP)
    return site


def round_env(site: str, spec: dict[str, Any]) -> dict[str, str]:
    """The command's environment for one round: ours first on PYTHONPATH, the spec in :data:`RUN_ENV`."""
    env = worker_env()
    env["PYTHONPATH"] = os.pathsep.join([site, env["PYTHONPATH"]])
    env[RUN_ENV] = json.dumps(spec)
    return env


def run_command_round(
    command: Sequence[str],
    site: str,
    spec: dict[str, Any],
    log_path: str,
    limits: RoundLimits,
    report: RoundReport,
    on_progress: Any = None,
    on_limit: Any = None,
) -> str | None:
    """One round of the command with ``spec`` (steps, log dir, experiment, version, settings...); ``None`` when
    it reported ``done``, else a one-line error (a command that ends without a fit says so)."""
    error = run_worker(
        list(command),
        "",
        log_path,
        on_progress=on_progress,
        env=round_env(site, spec),
        limits=limits,
        report=report,
        on_limit=on_limit,
    )
    if error == "the worker ended without reporting a result":
        return f"the command ended without finishing a Trainer.fit (log: {log_path})"
    return error


__all__ = [
    "LOADER_SETTINGS",
    "RUNTIME_SETTINGS",
    "RUNTIME_TARGETS",
    "RUN_ENV",
    "CLI_MAIN_MODULE",
    "TRAINER_SETTINGS",
    "check_command",
    "cli_targets",
    "config_command",
    "parse_settings",
    "split_overrides",
    "run_command_round",
    "write_bootstrap",
]
