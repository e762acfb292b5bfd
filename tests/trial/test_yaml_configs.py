"""A user's YAML is read within a node budget, and the tuned config changes the winner's key alone (issue 54).

A "billion laughs" file (anchors that alias each other ten times a level, nine levels: some 600 bytes, 10^9
leaves once expanded) loads in microseconds with PyYAML, which builds an alias as a second reference; what then
walks the value (the preflight dumped every trainer setting with ``json.dumps``) never returned. The commands run
as a user runs them, in a subprocess, with a 60 s timeout as the only guard against a hang: on the old code the
bomb under ``trainer.plugins`` sat in ``json.dumps``, the whole-file one in the ``repr`` of the "expected a
mapping" message, until killed.

The tuned config is written from the YAML nodes: a key under a mapping that an alias or a merge key shares with
another section is set in a copy, and the user's anchor names stay.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lightning_perf.analysis.run_discovery import load_hparams
from lightning_perf.trial.spec import TrialError
from lightning_perf.trial.tuned_config import write_tuned
from lightning_perf.tune.variants import check_override_value
from lightning_perf.yaml_budget import (
    MAX_NODES,
    SHORTENED_CHARS,
    YamlBudgetError,
    expanded_nodes,
    load_yaml,
    shortened_repr,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 60  # only a hang reaches it: the refusal takes well under a second of the command's own time
MEMORY_CAP_BYTES = 4 * 1024**3
MODEL = "model:\n  class_path: tests.helpers.TinyModel\ndata:\n  class_path: tests.helpers.TinyDataModule\n"


def bomb_items(levels: int = 9, indent: str = "") -> str:
    """Block-sequence items ``- &l0 [lol, ...]``, ``- &l1 [*l0, ...]``...: level k expands to 10^(k+1) leaves."""
    lines = [f"{indent}- &l0 [" + ", ".join(["lol"] * 10) + "]"]
    lines += [f"{indent}- &l{k} [" + ", ".join([f"*l{k - 1}"] * 10) + "]" for k in range(1, levels)]
    return "\n".join(lines) + "\n"


BOMBS = {
    # the whole file is the bomb: a list, not even a mapping
    "whole": bomb_items(),
    # a config as a project has it, with the bomb where a list of plugins goes
    "trainer.plugins": MODEL + "trainer:\n  max_epochs: 1\n  plugins:\n" + bomb_items(indent="  "),
}


def _memory_cap() -> None:
    # 4 GB of address space: the refusal runs in under 2 (it imports no torch; a CPU torch import needs more than
    # 2); the old code's repr and json.dumps of the bomb held 2.3-2.7 GB when the 60 s timeout killed them
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP_BYTES, MEMORY_CAP_BYTES))


def run_cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``lightning-perf ARGV`` as a user runs it, in its own process, its time and memory bounded."""
    return subprocess.run(
        [sys.executable, "-c", "import sys; from lightning_perf.cli import main; sys.exit(main())", *argv],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        preexec_fn=_memory_cap,
    )


@pytest.mark.parametrize("place", sorted(BOMBS))
@pytest.mark.parametrize("command", ["tune", "trial"])
def test_a_billion_laughs_config_is_refused_in_one_line_naming_the_file(tmp_path, command, place):
    config = tmp_path / "cfg.yaml"
    config.write_text(BOMBS[place])
    assert len(BOMBS[place]) < 1000
    variants = ["--variant", "a", "--variant", "b:trainer.benchmark=true"] if command == "trial" else []
    done = run_cli(command, "--config", "cfg.yaml", "--steps", "4", *variants, cwd=tmp_path)
    lines = done.stderr.splitlines()
    assert done.returncode == 2, done.stderr[-2000:]  # the CLI's code for bad input
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert lines[0].startswith(f"lightning-perf {command}: error: --config cfg.yaml: ")
    assert f"past the node budget of {MAX_NODES:,} YAML nodes" in lines[0]
    assert len(lines[0]) < 300
    assert done.stdout == ""
    assert not (tmp_path / "perf_logs").exists() and not (tmp_path / "cfg.tuned.yaml").exists()


def test_a_variant_value_that_expands_past_the_budget_is_refused_naming_the_variant():
    value = "[" + bomb_items().replace("\n- ", ", ").removeprefix("- ").strip() + "]"
    assert yaml.safe_load(value)  # PyYAML reads it in no time: the expansion comes later
    with pytest.raises(TrialError, match=r"the value of trainer\.plugins: it expands past the node budget"):
        check_override_value(f"b:trainer.plugins={value}", "trainer.plugins", value)


def test_the_budget_counts_aliases_as_expanded_once_per_node():
    assert expanded_nodes(yaml.compose("a: [1, 2]")) == 5  # the map, its key, the list, its 2 items
    # 3 levels of 10: 1 + 10 x (1 + 10 x (1 + 10)) for the last level, counted without expanding it
    three = yaml.compose(bomb_items(levels=3))
    assert expanded_nodes(three) == 1 + 11 + (1 + 10 * 11) + (1 + 10 * (1 + 10 * 11))
    assert expanded_nodes(yaml.compose(bomb_items())) == MAX_NODES + 1  # stops once past the budget
    assert expanded_nodes(yaml.compose("a: &a [1, *a]")) is None  # holds itself: no end to it
    with pytest.raises(YamlBudgetError, match="cfg.yaml: an alias in it refers to a node that holds it"):
        load_yaml("a: &a [1, *a]", "cfg.yaml")
    with pytest.raises(YamlBudgetError, match="cfg.yaml: it nests too deep to read"):
        load_yaml("[" * 5000 + "]" * 5000, "cfg.yaml")
    # what a config shares is still read as one object in two places
    shared = load_yaml("a: &d {x: 1}\nb: *d\nc: {<<: *d, y: 2}", "cfg.yaml")
    assert shared == {"a": {"x": 1}, "b": {"x": 1}, "c": {"x": 1, "y": 2}} and shared["a"] is shared["b"]


def test_a_message_shows_a_short_sketch_of_a_value_whatever_its_size():
    value = yaml.safe_load(bomb_items())  # 10^9 leaves once expanded
    text = shortened_repr(value)
    assert len(text) <= SHORTENED_CHARS and text.startswith("[['lol', 'lol', 'lol', ...], [[")
    assert (
        shortened_repr(-1) == "-1" and shortened_repr("fast") == "'fast'" and shortened_repr(True) == "True"
    )


def test_an_hparams_file_that_expands_past_the_budget_is_not_read(tmp_path):
    (tmp_path / "hparams.yaml").write_text("lr: 0.1\nsizes:\n" + bomb_items(indent="  "))
    assert load_hparams(str(tmp_path)) is None
    # unknown tags still read as plain data
    (tmp_path / "hparams.yaml").write_text("lr: 0.1\nshape: !!python/tuple [1, 2]\nobj: !custom {a: 1}\n")
    assert load_hparams(str(tmp_path)) == {"lr": 0.1, "shape": [1, 2], "obj": {"a": 1}}


SHARED = """\
defaults: &d {num_workers: 0, pin_memory: false}
model:
  class_path: m.M
  init_args: *d
data:
  class_path: d.D
  init_args: *d
"""


def test_the_tuned_config_changes_the_winners_key_alone_where_an_alias_shares_its_section(tmp_path):
    config = tmp_path / "cfg.yaml"
    config.write_text(SHARED)
    path, diff = write_tuned(str(config), {"data.init_args.num_workers": 4})
    tuned = yaml.safe_load(Path(path).read_text())
    assert tuned["data"]["init_args"] == {"num_workers": 4, "pin_memory": False}
    assert tuned["model"]["init_args"] == tuned["defaults"] == {"num_workers": 0, "pin_memory": False}
    text = Path(path).read_text()
    assert (
        "defaults: &d\n" in text and "init_args: *d\n" in text and "&id0" not in text
    )  # the user's name kept
    assert "# data.init_args is a copy of &d with the change; &d keeps its value" in diff
    assert "-  init_args: *d\n" in diff and "+    num_workers: 4\n" in diff
    assert config.read_text() == SHARED


def test_a_merged_section_is_copied_and_a_replaced_anchor_is_said(tmp_path):
    config = tmp_path / "cfg.yaml"
    config.write_text(
        "base: &b\n  init_args: {batch_size: 4, num_workers: 0}\n"
        "data:\n  <<: *b\n  class_path: d.D\ntrainer: {max_epochs: &epochs 1}\n"
    )
    path, diff = write_tuned(str(config), {"data.init_args.num_workers": 2, "trainer.max_epochs": 3})
    tuned = yaml.safe_load(Path(path).read_text())
    assert tuned["data"] == {"init_args": {"batch_size": 4, "num_workers": 2}, "class_path": "d.D"}
    assert (
        tuned["base"] == {"init_args": {"batch_size": 4, "num_workers": 0}}
        and tuned["trainer"]["max_epochs"] == 3
    )
    assert "# data.init_args is a copy of the mapping merged in by <<, with the change" in diff
    assert "base: &b\n" in Path(path).read_text()
    # &epochs named only the value the change replaced: the diff says it is gone
    assert (
        "# &epochs is gone: the value it named was replaced" in diff
        and "&epochs" not in Path(path).read_text()
    )
