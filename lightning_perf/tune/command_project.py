"""The command project, ``-- COMMAND ARGS...``: the user's own training command (a plain script, a Hydra app, a
LightningCLI script) run as given, each variant's settings (tune's names only) applied inside it at run time; the
winner is written where the diagnosis saw the project set it (:mod:`~lightning_perf.trial.project.terms`)."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

from lightning_perf.trial.project.command import RUNTIME_TARGETS, command_text, parse_settings
from lightning_perf.trial.project.terms import InProjectTerms, in_project_terms
from lightning_perf.trial.tuned_config import check_tuned_output
from lightning_perf.tune.diagnosis import CommandRun
from lightning_perf.tune.variants import FLAG, VariantArg


class CommandProject(CommandRun):
    """``args``: the command, checked (:func:`~lightning_perf.trial.project.command.check_command`)."""

    config_keys = False

    def __init__(self, args: Sequence[str]) -> None:
        self.args = list(args)

    @property
    def label(self) -> str:
        return command_text(self.args)

    def stem(self) -> str:
        """The experiment's stem: the script's (``train.py``, ``-m pkg.train``), or the program's."""
        args = self.args
        script = next((a for a in args[1:] if a.endswith(".py")), None)
        if script is None and "-m" in args[:-1]:
            script = args[args.index("-m") + 1].rsplit(".", 1)[-1]
        stem = os.path.splitext(os.path.basename(script or args[0]))[0]
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", stem).strip("_.") or "command"

    def command(self) -> list[str]:
        return list(self.args)

    def preflight(self, variants: Sequence[VariantArg]) -> None:
        """Every variant sets tune's setting names only, to values they take."""
        for variant in variants:
            parse_settings(variant.name, variant.overrides, FLAG)

    def check_output(self, facts: dict[str, Any], overwrite: bool) -> None:
        """A LightningCLI script's tuned config (its last ``--config``, once the diagnosis saw it) has a place."""
        configs = (facts.get("cli") or {}).get("configs")
        if configs:
            check_tuned_output(configs[-1], overwrite)

    def targets_of(self, facts: dict[str, Any]) -> dict[str, Any]:
        return RUNTIME_TARGETS

    def write(
        self, changes: dict[str, Any], facts: dict[str, Any], experiment_dir: str, overwrite: bool
    ) -> InProjectTerms:
        """The winner in the project's terms (raises OSError when a file cannot be written)."""
        return in_project_terms(facts, changes, experiment_dir, overwrite)
