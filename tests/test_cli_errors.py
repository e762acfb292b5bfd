"""A bad PerfCallback argument in a LightningCLI YAML ends in one line naming the argument and what is allowed,
with no traceback (issue 37): run as a user runs it, a real LightningCLI in a subprocess."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lightning_perf import PerfCallback
from lightning_perf.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
SCRIPT = """
from lightning.pytorch.cli import LightningCLI
from tests.helpers import TinyDataModule, TinyModel

LightningCLI(TinyModel, TinyDataModule, save_config_callback=None)
"""


def run_cli(tmp_path, init_args):
    config = {
        "trainer": {
            "default_root_dir": str(tmp_path),
            "max_epochs": 1,
            "limit_train_batches": 4,
            "enable_progress_bar": False,
            "callbacks": [{"class_path": "lightning_perf.PerfCallback", "init_args": init_args}],
        }
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "main.py").write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, str(tmp_path / "main.py"), "fit", "--config", str(tmp_path / "config.yaml")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,
    )


@pytest.mark.parametrize(
    ("init_args", "named"),
    [
        (
            {"probe_num_workers": "sometimes"},
            ["`probe_num_workers`", "'auto', 'always', 'never'", "'sometimes'"],
        ),
        ({"skip_first": -1}, ["`skip_first`", "an integer >= 0", "-1"]),
        ({"trace_ranks": "some"}, ["`trace_ranks`", '"auto", "all"', "'some'"]),
    ],
)
def test_a_bad_argument_ends_in_one_line_naming_it(tmp_path, init_args, named):
    done = run_cli(tmp_path, init_args)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: PerfCallback: "), done.stderr
    for part in named:
        assert part in last, last
    assert "Traceback" not in done.stderr + done.stdout
    assert "Does not validate against any of the Union subtypes" not in done.stderr
    assert not list(tmp_path.rglob("perf_summary.json"))  # nothing ran


def test_outside_a_command_line_the_error_is_raised():
    with pytest.raises(ConfigError, match="`probe_num_workers` must be one of 'auto', 'always', 'never'"):
        PerfCallback(probe_num_workers="sometimes")
