"""tune as its own stage (issue 55): the two kinds of project behind one :class:`Project` protocol, and one
``--variant`` parser, so ``tune`` and ``trial`` refuse a bad variant in the same words. No fit runs here."""

from __future__ import annotations

import inspect
import sys

import pytest

from lightning_perf.cli import main
from lightning_perf.trial.spec import TrialError
from lightning_perf.tune.command_project import CommandProject
from lightning_perf.tune.config_project import ConfigProject
from lightning_perf.tune.project import Project, project_of
from lightning_perf.tune.variants import VariantArg, parse_variant
from tests.trial.test_trial import workdir  # noqa: F401  (workdir: the fixture, a dir holding exp.yaml)

PROTOCOL_METHODS = [
    name for name, value in vars(Project).items() if not name.startswith("_") and callable(value)
]


@pytest.mark.parametrize(
    "project", [ConfigProject(["configs/exp.yaml"]), CommandProject(["python", "-m", "pkg.train", "lr=1"])]
)
def test_both_projects_satisfy_the_protocol_with_its_signatures(project):
    assert isinstance(project, Project)
    assert {"stem", "preflight", "diagnose", "trial", "write"} <= set(PROTOCOL_METHODS)
    for name in PROTOCOL_METHODS:
        wanted = inspect.signature(getattr(Project, name))
        given = inspect.signature(getattr(type(project), name))
        assert list(given.parameters) == list(wanted.parameters), name
        assert [p.kind for p in given.parameters.values()] == [p.kind for p in wanted.parameters.values()], (
            name
        )
    assert isinstance(project.label, str) and project.label
    assert project.stem() in ("exp", "train")


def test_project_of_picks_one_kind_and_refuses_both_or_neither():
    assert type(project_of("exp.yaml", None, None, "x")) is ConfigProject
    assert type(project_of(["a.yaml", "b.yaml"], None, "m:f", "x")) is ConfigProject
    command = project_of(None, [sys.executable, "train.py"], None, "x")
    assert type(command) is CommandProject and command.stem() == "train"
    with pytest.raises(TrialError, match="not both"):
        project_of("exp.yaml", [sys.executable], None, "x")
    with pytest.raises(TrialError, match=r"give --config CFG.yaml or your training command after --"):
        project_of(None, None, None, "x")
    with pytest.raises(TrialError, match="--cli: only with --config"):
        project_of(None, [sys.executable], "m:f", "x")


def test_a_variant_is_read_once_into_its_typed_value():
    variant = parse_variant("w:num_workers=4,data.init_args.sizes=[1, 2],trainer.precision=bf16-mixed")
    assert variant == VariantArg(
        "w", [("num_workers", "4"), ("data.init_args.sizes", "[1, 2]"), ("trainer.precision", "bf16-mixed")]
    )
    assert variant.values == {
        "num_workers": 4,
        "data.init_args.sizes": [1, 2],
        "trainer.precision": "bf16-mixed",
    }
    assert variant.keys == ["num_workers", "data.init_args.sizes", "trainer.precision"]


# each refused by the parser itself, or by the project's preflight on the parsed value
CONFIG_BAD = [
    "bad name!:num_workers=2",
    "w:",
    "w:num_workers",
    "w:trainer.max_steps=3",
    "w:num_workers=1,num_workers=2",
    "w:data.init_args.sizes=[1,2",
    "w:numworkers=4",
    "w:trainer.fast_dev_run=true",
]
COMMAND_BAD = ["w:num_workers=-1", "w:data.init_args.batch_size=8", "w:pin_memory=maybe"]


def _refusal(capsys, argv: list[str], prog: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"lightning-perf {prog}: error: --variant"), err
    return lines[0].removeprefix(f"lightning-perf {prog}: ")


@pytest.mark.parametrize(("bad", "after"), [(b, []) for b in CONFIG_BAD] + [(b, ["--"]) for b in COMMAND_BAD])
def test_tune_and_trial_refuse_a_bad_variant_in_the_same_words(workdir, capsys, bad, after):  # noqa: F811
    """One parser for both commands: the same line after the command's name, exit code 2, before any fit."""
    entry = [sys.executable, "train.py"] if after else []
    given = ["--config", "exp.yaml"] if not after else []
    tune = _refusal(capsys, ["tune", *given, "--variant", bad, *after, *entry], "tune")
    trial = _refusal(
        capsys, ["trial", *given, "--steps", "4", "--variant", "a", "--variant", bad, *after, *entry], "trial"
    )
    assert tune == trial
    assert not (workdir / "perf_logs").exists()


def test_the_commands_share_the_one_parser():
    import lightning_perf.cli.trial as trial_cli
    import lightning_perf.cli.tune as tune_cli
    import lightning_perf.tune.variants as variants

    assert tune_cli.parse_variant is trial_cli.parse_variant is variants.parse_variant
