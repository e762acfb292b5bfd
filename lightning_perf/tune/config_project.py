"""The config project, ``--config CFG.yaml`` (built with ``--cli``): a Lightning CLI config run as the command of
our Lightning CLI entry (:func:`~lightning_perf.trial.project.command.config_command`); a variant may set its keys
(``data.init_args.batch_size=8``) beside tune's setting names, and the winner is ``CFG.tuned.yaml`` beside it."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from lightning_perf.trial.project.command import cli_targets, config_command, split_overrides
from lightning_perf.trial.project.terms import InProjectTerms, in_project_terms
from lightning_perf.trial.spec import check_configs, check_timed_settings
from lightning_perf.trial.tuned_config import check_tuned_output
from lightning_perf.tune.diagnosis import CommandRun
from lightning_perf.tune.variants import FLAG, VariantArg


class ConfigProject(CommandRun):
    """``configs`` (``trial`` merges several; ``tune`` takes one) and how to build their CLI (``cli``)."""

    config_keys = True

    def __init__(self, configs: Sequence[str], cli: str | None = None) -> None:
        self.configs = list(configs)
        self.cli = cli

    @property
    def label(self) -> str:
        return " ".join(self.configs)

    def stem(self) -> str:
        """The experiment's stem: the (first) config's."""
        return os.path.splitext(os.path.basename(self.configs[0]))[0]

    def command(self) -> list[str]:
        return config_command(self.configs, self.cli)

    def preflight(self, variants: Sequence[VariantArg]) -> None:
        """The configs build, time something, and every variant's keys are settings or config keys."""
        check_configs(self.configs, self.cli)
        check_timed_settings(self.configs, [v.pair for v in variants])
        for variant in variants:
            split_overrides(variant.name, variant.overrides, FLAG, config_keys=True)

    def check_output(self, facts: dict[str, Any], overwrite: bool) -> None:
        """The tuned config's place takes a file (raises :class:`~lightning_perf.trial.spec.TrialError`)."""
        check_tuned_output(self.configs[-1], overwrite)

    def targets_of(self, facts: dict[str, Any]) -> dict[str, Any]:
        return cli_targets(facts.get("cli"))

    def write(
        self, changes: dict[str, Any], facts: dict[str, Any], experiment_dir: str, overwrite: bool
    ) -> InProjectTerms:
        """The tuned copy, named as the config was given (raises OSError when it cannot be written)."""
        if facts.get("cli"):
            facts = {**facts, "cli": {**facts["cli"], "configs": list(self.configs)}}
        return in_project_terms(facts, changes, experiment_dir, overwrite)
