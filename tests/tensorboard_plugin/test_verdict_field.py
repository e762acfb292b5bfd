"""The Perf tab's verdict (issue 55, typed states): read from the input-bound finding's ``verdict`` field that a
real fit wrote, the same for the summary as the previous release wrote it (no field: its title names the grade),
and unchanged when the title's words change. Served by a real `tensorboard` over copies of a real run."""

from __future__ import annotations

import json
import shutil

import pytest

from lightning_perf.analysis.rules.thresholds import VERDICTS
from tests.tensorboard_plugin.test_routes import pane
from tests.tensorboard_server import TensorBoardServer


def _rewrite(path, edit) -> None:
    data = json.loads(path.read_text())
    for finding in data["findings"]:
        edit(finding)
    path.write_text(json.dumps(data))


@pytest.fixture(scope="module")
def edited_runs(perf_runs, tmp_path_factory):
    """exp/new: a real run's summary as written; exp/old: the same without the verdict field; exp/reworded:
    the same with the input-bound finding's title in other words."""
    root = tmp_path_factory.mktemp("verdict_field")
    for name in ("new", "old", "reworded"):
        shutil.copytree(perf_runs / "exp" / "workers0", root / "exp" / name)
    _rewrite(root / "exp" / "old" / "perf_summary.json", lambda f: f.pop("verdict"))

    def reword(finding: dict) -> None:
        if finding["id"] == "input_bound":
            finding["title"] = "The DataLoader holds the steps back"

    _rewrite(root / "exp" / "reworded" / "perf_summary.json", reword)
    return root


def test_the_tab_reads_the_verdict_field_and_an_old_summary_its_title(edited_runs):
    written = json.loads((edited_runs / "exp" / "new" / "perf_summary.json").read_text())
    (found,) = [f for f in written["findings"] if f["id"] == "input_bound"]
    assert found["verdict"] in VERDICTS and found["verdict"] in found["title"]  # the fit wrote the field
    server = TensorBoardServer(str(edited_runs))
    try:
        server.wait_for("/data/plugins_listing", lambda r: r.get("lightning_perf", {}).get("enabled"))
        listed = {r["name"]: r["verdict"] for r in pane(server, "/runs")["runs"]}
        assert listed == {
            "exp/new": found["verdict"],
            "exp/old": found["verdict"],
            "exp/reworded": found["verdict"],
        }
        for name in listed:
            assert pane(server, "/overview", run=name)["verdict"]["verdict"] == found["verdict"], name
    finally:
        server.close()
