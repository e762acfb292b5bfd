"""``compare`` lists the user's hyperparameters that differ between runs (issue 25, point 8), from the
``hparams.yaml`` Lightning saves beside each run's summary: real fits, the real command, text, Markdown and JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_perf import PerfCallback
from lightning_perf.analysis.run_discovery import load_hparams
from lightning_perf.analysis.verdicts.comparison_render import from_json
from lightning_perf.analysis.verdicts.hparams_diff import ABSENT, difference_labels, flatten, hparams_diffs
from lightning_perf.cli import main
from tests.helpers import TinyModel, loader, trainer


class Model(TinyModel):
    def __init__(self, batched_transforms: bool = False, lr: float = 0.01, widths: tuple = (8, 1)):
        super().__init__()
        self.save_hyperparameters()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("logs")
    dirs = []
    for name, batched in (("before", False), ("after", True)):
        callback = PerfCallback(enable_profiler=False, utilization=False, probe_num_workers="never")
        fit = trainer(root, [callback], limit_train_batches=6, logger=TensorBoardLogger(root, version=name))
        fit.fit(Model(batched_transforms=batched), loader(n=24))
        dirs.append(Path(fit.logger.log_dir))
    return dirs[0], dirs[1]


def run(capsys, *args) -> str:
    assert main(["compare", *map(str, args), "--no-tensorboard"]) == 0
    return capsys.readouterr().out


def test_text_lists_the_hyperparameter_that_differs_instead_of_no_settings_differ(runs, capsys):
    out = run(capsys, *runs)
    assert "hyperparameters that differ" in out
    line = next(line for line in out.splitlines() if "batched_transforms" in line)
    assert line.split() == ["batched_transforms", "False", "True"]
    assert "lr" not in {line.split()[0] for line in out.splitlines() if line.strip()}  # equal: not listed
    assert "no settings differ" not in out and "same settings" not in out


def test_markdown_and_json_carry_it_too(runs, capsys):
    markdown = run(capsys, *runs, "--format", "markdown")
    assert "| hyperparameter | `before` (baseline) | `after` |" in markdown
    assert "| `batched_transforms` | `False` | `True` |" in markdown
    assert "No settings differ between the runs." not in markdown
    data = json.loads(run(capsys, *runs, "--format", "json"))
    assert data["hparams_diff"] == {"batched_transforms": [False, True]}
    assert from_json(data).hparams_diff == {"batched_transforms": [False, True]}


def test_hparams_are_read_from_the_yaml_lightning_saved(runs):
    saved = load_hparams(str(runs[0]))
    assert saved["batched_transforms"] is False and saved["lr"] == 0.01
    assert saved["widths"] == [8, 1]  # a !!python/tuple read as plain data, never constructed
    assert load_hparams(str(runs[0] / "nowhere")) is None


def test_diffs_flatten_nested_keys_skip_private_ones_and_mark_absent_keys():
    cli = {"_instantiator": "x", "data": {"init_args": {"num_workers": 0}}, "lr": 0.1}
    assert flatten(cli) == {"data.init_args.num_workers": 0, "lr": 0.1}
    other = {"_instantiator": "y", "data": {"init_args": {"num_workers": 2}}, "lr": 0.1, "extra": 1}
    assert hparams_diffs([cli, other]) == {"data.init_args.num_workers": [0, 2], "extra": [ABSENT, 1]}
    # a run without saved hyperparameters has no say, and one run alone tells nothing
    assert hparams_diffs([cli, None, other])["data.init_args.num_workers"] == [0, None, 2]
    assert hparams_diffs([cli, None]) == {} and hparams_diffs([]) == {}


def test_difference_labels_name_each_run_by_what_differs():
    runs = [
        {"perf/num_workers": 0, "lr": 0.1, "perf/precision": "32"},
        None,
        {"perf/num_workers": 2, "lr": 0.1},
    ]
    assert difference_labels(runs) == [
        "num_workers=0, precision=32",
        "",
        "num_workers=2, precision=(not set)",
    ]
    assert difference_labels([{"lr": 0.1}, {"lr": 0.1}]) == ["", ""]
