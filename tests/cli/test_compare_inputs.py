"""``lightning-perf compare`` on what it reads and writes (issue 25): corrupt summaries get errors that name the
field; its TensorBoard tags sit in the registry's sections."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_perf.analysis.metrics import COMPARISON_CHART, COMPARISON_TEXT, METRICS, RENAMED_FROM, by_tag
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


def test_tensorboard_tags_sit_in_the_registrys_sections_beside_a_runs_text_and_images(pair):
    """Not a section "perf" of its own (perf/comparison/..., perf/comparison_chart) beside perf_text and perf_images."""
    before, after = pair
    assert compare(before, after) == 0
    events = EventAccumulator(str(before.parent / "perf_compare"), size_guidance={"tensors": 0, "images": 0})
    events.Reload()
    tags = events.Tags()
    assert tags["tensors"] == [f"{COMPARISON_TEXT.tag}/text_summary"] == ["perf_text/comparison/text_summary"]
    assert tags["images"] == [COMPARISON_CHART.tag] == ["perf_images/comparison_chart"]
    sections = {tag.split("/", 1)[0] for tag in tags["tensors"] + tags["images"]}  # TensorBoard's sections
    assert sections <= {m.tag.split("/", 1)[0] for m in METRICS} and "perf" not in sections
    markdown = events.Tensors(f"{COMPARISON_TEXT.tag}/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "### Performance comparison" in markdown
    assert by_tag(COMPARISON_CHART.tag) is COMPARISON_CHART
    assert RENAMED_FROM["perf/comparison"] is COMPARISON_TEXT  # the migration note lists the old tags
