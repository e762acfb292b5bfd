"""The documentation stays true: the metric table (docs/metrics.md) is the registry's, the Architecture page names
real paths, the Python API page names every public name, and nothing points outside the repository."""

from __future__ import annotations

import glob
import re
from pathlib import Path

import lightning_perf
from lightning_perf.analysis import metrics, metrics_table

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text(encoding="utf-8")


def page(name: str) -> str:
    """The text of a page under docs/."""
    return (DOCS / name).read_text(encoding="utf-8")


def test_the_metric_table_is_the_registrys():
    # regenerate with: python -m lightning_perf.analysis.metrics_table docs/metrics.md
    assert metrics_table.readme_table(page("metrics.md")) == metrics_table.markdown_table()


def test_every_logged_tag_falls_in_a_tensorboard_section_of_its_group():
    # TensorBoard's dashboard groups a tag by tag.split("/", 1)[0]: one section a group
    for metric in metrics.METRICS:
        assert metric.tag.split("/", 1)[0] == f"perf_{metric.group}"
    assert len({m.tag for m in metrics.METRICS}) == len(metrics.METRICS)
    assert all(metrics.by_tag(m.tag) is m for m in metrics.METRICS)


def test_every_path_the_architecture_page_names_exists():
    named = re.findall(r"`((?:lightning_perf|tests)/[^`\s]*)`", page("architecture.md"))
    assert len(named) >= 15
    missing = [path for path in named if not glob.glob(str(ROOT / path))]
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_every_stage_folder_is_described_on_the_architecture_page():
    text = page("architecture.md")
    package = ROOT / "lightning_perf"
    for folder in sorted(p for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists()):
        assert f"`lightning_perf/{folder.name}/`" in text, folder.name


def test_the_python_api_page_names_every_public_name():
    text = page("api.md")
    for name in lightning_perf.__all__:
        if name != "__version__":
            assert f"`{name}" in text, name
            assert f"::: lightning_perf.{name}\n" in text, f"no reference generated for {name}"


def test_nothing_points_outside_the_repository():
    texts = {"README.md": README, "mkdocs.yml": (ROOT / "mkdocs.yml").read_text(encoding="utf-8")}
    texts |= {f"docs/{p.name}": p.read_text(encoding="utf-8") for p in DOCS.rglob("*.md")}
    for name, text in texts.items():
        assert "../" not in text and "DESIGN.md" not in text, name
    for path in (ROOT / "lightning_perf").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "DESIGN" not in text and "brief" not in text, path
