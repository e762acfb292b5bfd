"""``lightning-perf compare`` on what it reads (issue 25): corrupt summaries get errors that name the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_perf.analysis.summary import SUMMARY_FILENAME
from tests.cli.test_compare_command import compare, save_run


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "logs"
    return (
        save_run(root / "before", step_ms=100.0, data_wait_pct=45.0, num_workers=0),
        save_run(root / "after", step_ms=60.0, data_wait_pct=3.1, num_workers=2),
    )


def _damage(run: Path, edit) -> Path:
    path = run / SUMMARY_FILENAME
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    return path


def _drop(*keys):
    def edit(data):
        for key in keys:
            del data["timing"]["step_time_ms"][key]

    return edit


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_drop("median", "p90", "min"), "timing.step_time_ms: missing median, p90, min"),
        (
            lambda d: d["timing"].update(steps="40"),
            "timing.steps: expected a whole number, got the string '40'",
        ),
        (lambda d: d["timing"].update(steps=40.5), "timing.steps: expected a whole number, got 40.5"),
        (
            lambda d: d["timing"].update(data_wait_pct=True),
            "timing.data_wait_pct: expected a number, got true",
        ),
        (
            lambda d: d["timing"].update(step_time_ms=[1, 2]),
            "timing.step_time_ms: expected an object, got a list",
        ),
        (lambda d: d.update(timing=None), "timing: expected an object, got null"),
        (
            lambda d: d["timing"].update(step_samples_ms=[1.0, "x"]),
            "timing.step_samples_ms[1]: expected a number",
        ),
        (
            lambda d: d.update(findings=[{"id": "x", "severity": "low"}]),
            "findings[0]: missing title, evidence",
        ),
        (lambda d: d["settings"].update(num_workers="two"), "settings.num_workers: expected a whole number"),
    ],
)
def test_a_malformed_summary_error_names_the_field_never_a_class(pair, capsys, edit, message):
    before, after = pair
    path = _damage(after, edit)
    assert compare(before, after, "--no-tensorboard") == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"lightning-perf compare: error: {path}: malformed run summary: {message}"), err
    for python in ("__init__", "Distribution", "TimingSummary", "RunSummary", "positional", "Traceback"):
        assert python not in err
