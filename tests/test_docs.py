"""README.md is a front door and docs/ a site that builds: the README stays small and its quick start runs as
written, every page is in mkdocs.yml's nav, every relative link lands, every finding id the code can give is on
the findings page, and ``mkdocs build --strict`` passes."""

from __future__ import annotations

import argparse
import ast
import html
import importlib
import importlib.util
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
README_LIMIT_BYTES = 25 * 1024
PAGES = sorted(DOCS.rglob("*.md"))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)|<img [^>]*src=\"([^\"]+)\"")
# the pages a user reads to see what they get: each shows it (the end-of-fit answer, the Perf tab, a report PNG)
PICTURED = ("index.md", "callback.md", "findings.md", "commands.md", "perf-tab.md")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
PAGE_WORD_LIMIT = 1500  # words outside tables and code: a page longer than this is split by topic
CELL_WORD_LIMIT = 40  # words in one table cell: a table is an index, its detail is a paragraph below it
CELL_SPLIT = re.compile(r"(?<!\\)\|")  # a table row's cell borders: every | not escaped as \|


def section(text: str, title: str) -> str:
    """The text of a ``## title`` section, up to the next ``## ``."""
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


def nav_pages(nav: list) -> list[str]:
    """Every page file named in a MkDocs nav, however deep."""
    found: list[str] = []
    for entry in nav:
        items = entry.values() if isinstance(entry, dict) else [entry]
        for item in items:
            found += nav_pages(item) if isinstance(item, list) else [item]
    return found


def slug(heading: str) -> str:
    """The anchor GitHub and MkDocs (its default toc slugify) give a heading."""
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"\s+", "-", text)


def anchors(path: Path) -> set[str]:
    """A page's anchors: its headings' slugs and the ids of its inline HTML (``<a id="input_bound"></a>``)."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    headings = {slug(h.replace("`", "")) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}
    return headings | set(re.findall(r"<a id=\"([^\"]+)\"></a>", text))


def link_lands(page: Path, target: str) -> bool:
    """Whether a relative link written on ``page`` reaches a file in the repository and, if it names one, an
    anchor of that file."""
    file, _, anchor = target.partition("#")
    linked = (page.parent / file).resolve() if file else page
    if not linked.is_file() or ROOT not in linked.parents:
        return False
    return not (anchor and linked.suffix == ".md" and anchor not in anchors(linked))


def finding_ids() -> dict[str, str]:
    """Every ``Finding(id=...)`` in the package: the id, as a string or a module-level constant, and where."""
    ids: dict[str, str] = {}
    for path in sorted((ROOT / "lightning_perf").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        constants = {
            target.id: node.value.value
            for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Finding"):
                continue
            for keyword in node.keywords:
                if keyword.arg != "id":
                    continue
                value = keyword.value
                if isinstance(value, ast.Constant):
                    ids[value.value] = f"{path.relative_to(ROOT)}:{node.lineno}"
                elif isinstance(value, ast.Name) and isinstance(constants.get(value.id), str):
                    ids[constants[value.id]] = f"{path.relative_to(ROOT)}:{node.lineno}"
                else:
                    raise AssertionError(f"{path}:{node.lineno}: a Finding id this test cannot read")
    return ids


def test_the_readme_is_a_front_door():
    size = README.stat().st_size
    assert size <= README_LIMIT_BYTES, (
        f"README.md is {size} bytes, over {README_LIMIT_BYTES}: move detail to docs/"
    )


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    listed = nav_pages(config["nav"])
    pages = [p.relative_to(DOCS).as_posix() for p in PAGES]
    assert sorted(listed) == sorted(set(listed)), "a page is listed twice in mkdocs.yml's nav"
    assert not set(pages) - set(listed), (
        f"pages missing from mkdocs.yml's nav: {sorted(set(pages) - set(listed))}"
    )
    assert not set(listed) - set(pages), f"nav entries with no page: {sorted(set(listed) - set(pages))}"


@pytest.mark.parametrize("path", [README, *PAGES], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_points_to_a_file_that_exists(path: Path):
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        if not link_lands(path, target):
            broken.append(target)
    assert not broken, f"{path.relative_to(ROOT)}: broken links {broken}"


def test_every_finding_id_in_the_code_is_on_the_findings_page():
    ids = finding_ids()
    assert len(ids) >= 20, sorted(ids)  # the scan itself still finds the rules
    text = (DOCS / "findings.md").read_text(encoding="utf-8")
    missing = {i: where for i, where in ids.items() if f"`{i}`" not in text}
    assert not missing, f"finding ids missing from docs/findings.md: {missing}"


def test_every_finding_id_has_an_anchor_on_the_findings_page():
    # a finding names its id; `findings.md#<id>` (from any page) lands on that id's row
    missing = [i for i in sorted(finding_ids()) if not link_lands(DOCS / "index.md", f"findings.md#{i}")]
    assert not missing, f'no anchor on docs/findings.md for {missing}: add <a id="ID"></a> to its row'


def prose_words(path: Path) -> int:
    """A page's words outside fenced code and table rows (lines starting with ``|``)."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return sum(len(line.split()) for line in text.splitlines() if not line.startswith("|"))


def test_no_page_is_a_wall_of_text():
    long = {p.relative_to(DOCS).as_posix(): n for p in PAGES if (n := prose_words(p)) > PAGE_WORD_LIMIT}
    assert not long, (
        f"pages over {PAGE_WORD_LIMIT} words outside tables and code (split them by topic): {long}"
    )


def table_cells(path: Path) -> list[str]:
    """Every cell of a page's tables (rows are lines starting with ``|``, outside fenced code), code spans and
    links included as written."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    cells = []
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        parts = CELL_SPLIT.split(line.strip())[1:]  # the text before the opening | is no cell
        if parts and not parts[-1].strip():
            parts = parts[:-1]  # nor what follows the closing |
        cells += [part.strip() for part in parts]
    return cells


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_table_cell_is_a_paragraph(path: Path):
    # a table is an index to scan: a cell says when or what in a few words and links to the detail below it
    long = [
        f"{len(cell.split())} words: {' '.join(cell.split()[:8])} ..."
        for cell in table_cells(path)
        if len(cell.split()) > CELL_WORD_LIMIT
    ]
    assert not long, (
        f"{path.relative_to(ROOT)}: table cells over {CELL_WORD_LIMIT} words (move the detail under a heading "
        f"below the table and link to it): {long}"
    )


def flag_rows(command: str) -> list[str]:
    """The start of each row of a command's flags table, ``| flag | default |``, from its argparse definitions."""
    from lightning_perf.cli import COMMANDS

    parser = argparse.ArgumentParser(prog=f"lightning-perf {command}")
    importlib.import_module(COMMANDS[command]).add_arguments(parser)
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if not action.option_strings:
            flag = f"`{action.metavar or action.dest.upper()}`" + (
                " ..." if action.nargs in ("+", "*") else ""
            )
        elif action.nargs == 0:
            flag = ", ".join(f"`{o}`" for o in action.option_strings)
        else:
            metavar = action.metavar or (
                "{" + ",".join(map(str, action.choices)) + "}" if action.choices else action.dest.upper()
            )
            flag = f"`{action.option_strings[0]} {metavar}`"
        if action.required or not action.option_strings:
            default = "required"
        elif isinstance(action, argparse._StoreTrueAction):
            default = "off"
        elif action.default in (None, []):
            default = "none"
        else:
            default = f"`{action.default}`"
        rows.append(f"| {flag} | {default} |")
    return rows


def test_every_command_has_a_page_with_every_flag_and_its_default():
    from lightning_perf.cli import COMMANDS

    index = (DOCS / "commands.md").read_text(encoding="utf-8")
    for command in COMMANDS:
        page = DOCS / f"command-{command}.md"
        assert page.is_file() and f"](command-{command}.md)" in index, f"no page docs/command-{command}.md"
        text = page.read_text(encoding="utf-8")
        assert "| flag | default | what it does |" in text, f"{page.name}: no flags table"
        missing = [row for row in flag_rows(command) if row not in text]
        assert not missing, (
            f"docs/command-{command}.md: flags table rows missing or with another default: {missing}"
        )


def images(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return [a or b for a, b in IMAGE.findall(text)]


@pytest.mark.parametrize("path", [README, *PAGES], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_image_a_page_shows_exists(path: Path):
    # mkdocs --strict builds a page whose image is missing: this test is what fails
    missing = [src for src in images(path) if not (path.parent / src).is_file()]
    assert not missing, f"{path.relative_to(ROOT)}: images not found {missing}"


@pytest.mark.parametrize("name", PICTURED)
def test_the_pages_of_what_a_user_sees_show_it(name: str):
    assert images(DOCS / name), f"docs/{name} has no picture of what the user sees"


def test_the_docs_quick_start_is_the_readmes():
    readme = python_blocks(section(README.read_text(encoding="utf-8"), "Quick start"))
    docs = python_blocks(section((DOCS / "getting-started.md").read_text(encoding="utf-8"), "Quick start"))
    assert readme and readme[-1] in docs


def test_the_readme_quick_start_runs_as_written(tmp_path: Path):
    # a real fit of the quick start's code blocks, in a fresh process and folder (a few seconds on 2 cores)
    code = "\n".join(python_blocks(section(README.read_text(encoding="utf-8"), "Quick start")))
    assert "PerfCallback()" in code
    (tmp_path / "quickstart.py").write_text(code, encoding="utf-8")
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    )
    done = subprocess.run(
        [sys.executable, "quickstart.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "highly input-bound" in output, output[-4000:]  # the verdict the README shows
    assert list(tmp_path.glob("lightning_logs/version_0/perf_summary.json")), sorted(tmp_path.rglob("*"))


def test_the_site_builds_strictly(tmp_path: Path):
    missing = [
        m for m in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python") if not has(m)
    ]
    if missing:
        pytest.skip(f"the docs extra is not installed (pip install -e '.[docs]'): no {', '.join(missing)}")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    findings = (tmp_path / "site" / "findings" / "index.html").read_text(encoding="utf-8")
    unanchored = [i for i in sorted(finding_ids()) if f'id="{i}"' not in findings]
    assert not unanchored, f"the built findings page has no anchor for {unanchored}"
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    assert api.count('id="lightning_perf.') >= 11  # a reference entry a public name, from the docstrings
    # PerfCallback opens with its signature, every argument with its default, not its computed bases
    text = html.unescape(re.sub(r"<[^>]+>", "", api))
    assert "callback_bases" not in text, "the API page shows PerfCallback's computed bases"
    found = re.search(r"PerfCallback\(\s*(skip_first=5,.*?)\)\s", text, re.S)
    assert found, "the API page shows no PerfCallback(skip_first=5, ...) signature"
    shown = re.sub(r"\s+", "", found.group(1)).rstrip(",").split(",")
    from lightning_perf import PerfCallback

    expected = [
        f"{name}={param.default!r}".replace("'", '"')
        for name, param in inspect.signature(PerfCallback).parameters.items()
    ]
    assert shown == expected, f"the API page's PerfCallback signature {shown} is not the code's {expected}"


def has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False
