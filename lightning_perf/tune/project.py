"""What ``tune`` and ``trial`` run: a :class:`Project`, the Lightning CLI config (``--config``,
:class:`~lightning_perf.tune.config_project.ConfigProject`) or the user's training command (``-- COMMAND``,
:class:`~lightning_perf.tune.command_project.CommandProject`). Both run as a command: one path diagnoses, measures
(the settings applied inside the command at run time) and writes the winner in the project's terms; the steps
between (propose, plan, decide) are :mod:`lightning_perf.tune.run`'s. :func:`project_of` is the one place that
tells the two apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from lightning_perf.trial.project.command import check_command
from lightning_perf.trial.project.terms import InProjectTerms
from lightning_perf.trial.runner import RoundLimits, RoundReport
from lightning_perf.trial.spec import TrialError, TrialResult
from lightning_perf.tune.command_project import CommandProject
from lightning_perf.tune.config_project import ConfigProject
from lightning_perf.tune.diagnosis import Diagnosis
from lightning_perf.tune.variants import VariantArg


@runtime_checkable
class Project(Protocol):
    """A project tune diagnoses, measures and writes the winner into."""

    @property
    def label(self) -> str:
        """How the result names it: the config's path, or the command."""
        ...

    def stem(self) -> str:
        """The experiment's stem (``<stem>_tune``, trial's default ``--name``)."""
        ...

    def preflight(self, variants: Sequence[VariantArg]) -> None:
        """What can fail without a fit (raises :class:`~lightning_perf.trial.spec.TrialError`)."""
        ...

    def check_output(self, facts: dict[str, Any], overwrite: bool) -> None:
        """The winner's file has a place (before the rounds; ``facts`` as the diagnosis saw them, or none)."""
        ...

    def diagnose(
        self, steps: int, log_dir: str, experiment: str, limits: RoundLimits, report: RoundReport
    ) -> Diagnosis:
        """The diagnosis fit, bounded by ``limits``."""
        ...

    def targets(self, diagnosis: Diagnosis) -> dict[str, Any]:
        """Where the candidates set each setting."""
        ...

    def trial(
        self,
        variants: Sequence[VariantArg],
        steps: int,
        log_dir: str,
        name: str,
        *,
        repeats: int = ...,
        warmup_steps: int = ...,
        limits: RoundLimits | None = None,
        timeout_s: float | None = None,
    ) -> TrialResult:
        """The variants' interleaved rounds."""
        ...

    def write(
        self, changes: dict[str, Any], facts: dict[str, Any], experiment_dir: str, overwrite: bool
    ) -> InProjectTerms:
        """The winner in the project's terms (raises OSError when a file cannot be written)."""
        ...


def project_of(
    configs: str | Sequence[str] | None,
    command: Sequence[str] | None,
    cli: str | None,
    example: str,
) -> Project:
    """What tune and trial are given to run: ``--config`` (one, or ``trial``'s several) or a command after ``--``,
    exactly one. A command is checked here (found, no ``--cli``); ``example`` shows the command form."""
    if (configs is None) == (command is None):
        raise TrialError(
            f"give --config CFG.yaml or your training command after -- (e.g. `{example}`)"
            + (", not both" if command is not None else "")
        )
    if command is None:
        return ConfigProject([configs] if isinstance(configs, str) else list(configs or []), cli)
    checked = check_command(command)
    if cli is not None:
        raise TrialError("--cli: only with --config; a command builds its own CLI")
    return CommandProject(checked)
