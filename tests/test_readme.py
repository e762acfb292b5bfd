"""The README stays true: its metric table is the registry's, its Architecture section names real paths."""

from __future__ import annotations

import glob
import re
from pathlib import Path

import lightning_perf
from lightning_perf.analysis import metrics, metrics_table

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    """The text of a ``## title`` section, up to the next ``## ``."""
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else None]


def test_the_metric_table_is_the_registrys():
    # regenerate with: python -m lightning_perf.analysis.metrics_table README.md
    assert metrics_table.readme_table(README) == metrics_table.markdown_table()


def test_every_logged_tag_falls_in_a_tensorboard_section_of_its_group():
    # TensorBoard's dashboard groups a tag by tag.split("/", 1)[0]: one section a group
    for metric in metrics.METRICS:
        assert metric.tag.split("/", 1)[0] == f"perf_{metric.group}"
    assert len({m.tag for m in metrics.METRICS}) == len(metrics.METRICS)
    assert all(metrics.by_tag(m.tag) is m for m in metrics.METRICS)


def test_every_path_the_architecture_section_names_exists():
    named = re.findall(r"`((?:lightning_perf|tests)/[^`\s]*)`", section("Architecture"))
    assert len(named) >= 15
    missing = [path for path in named if not glob.glob(str(ROOT / path))]
    assert not missing, f"the Architecture section names paths that do not exist: {missing}"


def test_every_stage_folder_is_described_in_the_architecture_section():
    text = section("Architecture")
    package = ROOT / "lightning_perf"
    for folder in sorted(p for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists()):
        assert f"`lightning_perf/{folder.name}/`" in text, folder.name


def test_the_python_api_section_names_every_public_name():
    text = section("Python API")
    for name in lightning_perf.__all__:
        if name != "__version__":
            assert f"`{name}" in text, name


def test_nothing_points_outside_the_repository():
    assert "../" not in README and "DESIGN.md" not in README
    for path in (ROOT / "lightning_perf").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "DESIGN" not in text and "brief" not in text, path
