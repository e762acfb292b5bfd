"""Markdown for TensorBoard's Text tab, ``compare --format markdown`` and ``report --format markdown``.

Written here once (no library is kept for it: the tables are three lines of string joining, and every writer
needs the same escaping).
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Collection, Sequence


def cell(text: str) -> str:
    """Text safe inside a table cell: a pipe would split the cell (even in a code span), a newline the row."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def code(text: str) -> str:
    """A code span: keeps underscores in run and setting names from turning into emphasis."""
    return "`" + str(text).replace("`", "'") + "`"


def table(
    header: Sequence[str], rows: Sequence[Sequence[str]], right_aligned: Collection[int] = ()
) -> list[str]:
    """A GitHub-flavoured Markdown table as lines; columns in ``right_aligned`` (indexes) align right."""

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cell(c) for c in cells) + " |"

    align = "|" + "|".join("---:" if i in right_aligned else "---" for i in range(len(header))) + "|"
    return [line(header), align, *(line(r) for r in rows)]


# -- TensorBoard's Text tab --------------------------------------------------------------------------------
# TensorBoard renders Text server-side with Python-Markdown (tables and fenced code only), not GitHub's
# renderer: consecutive lines join into one paragraph, a list needs a blank line before it, and its table takes
# the pane's width, so one long cell squeezes the short columns until words break ("hi/gh").

# a table cell wider than this is wrapped (``<br>``) or moved below the table
TEXT_TAB_CELL_CHARS = 40
# a column whose cells are mostly longer than that (evidence, recommendations) is listed below the table
_PROSE_CELL_CHARS = 80
# a single cell longer than this becomes a numbered note below the table (a long setting's value)
_NOTE_CELL_CHARS = 120
_ARROW = re.compile(r"(?<![<-])->(?!>)")
_CODE_SPAN = re.compile(r"`[^`]*`")
_LIST_ITEM = re.compile(r"\s{0,3}([-*+]|\d+\.)\s")
_PIPE = re.compile(r"(?<!\\)\|")


def for_text_tab(markdown: str) -> str:
    """``markdown`` rewritten to render as written in TensorBoard's Text tab: one paragraph per line, a blank
    line before lists and tables, arrows as "→" (outside code spans), short table cells."""
    out: list[str] = []
    table_rows: list[str] = []
    previous, fenced = "blank", False
    for line in [*markdown.splitlines(), ""]:
        if line.lstrip().startswith("```"):
            fenced = not fenced
        kind = "code" if fenced or line.lstrip().startswith("```") else _kind(line)
        if table_rows and kind != "table":
            out.extend(_text_tab_table(table_rows))
            table_rows = []
        if kind not in ("blank", "code") and previous != "blank" and _starts_block(previous, kind):
            out.append("")
        if kind == "table":
            table_rows.append(_arrows(line))
        else:
            out.append(line if kind == "code" else _arrows(line))
        previous = kind
    return "\n".join(out).rstrip("\n") + "\n"


def _kind(line: str) -> str:
    stripped = line.strip()
    if not stripped:
        return "blank"
    if stripped.startswith("|"):
        return "table"
    if stripped.startswith("#"):
        return "heading"
    if stripped.startswith(">"):
        return "quote"
    if _LIST_ITEM.match(line):
        return "list"
    return "indented" if line.startswith("  ") else "text"


def _starts_block(previous: str, kind: str) -> bool:
    """Whether a blank line must separate a ``kind`` line from the ``previous`` one."""
    same_block = {("table", "table"), ("list", "list"), ("list", "indented"), ("indented", "indented")}
    same_block |= {("indented", "list"), ("quote", "quote"), ("code", "code")}
    return (previous, kind) not in same_block


def _arrows(line: str) -> str:
    """ "->" as "→" outside code spans: a ">" after a line break in the source would start a quote."""
    parts, last = [], 0
    for span in _CODE_SPAN.finditer(line):
        parts += [_ARROW.sub("→", line[last : span.start()]), span.group()]
        last = span.end()
    return "".join([*parts, _ARROW.sub("→", line[last:])])


def _cells(row: str) -> list[str]:
    return [c.strip() for c in _PIPE.split(row.strip().strip("|"))]


def _width(text: str) -> int:
    return len(text.replace("`", "").replace("**", "").replace("\\|", "|"))


def _text_tab_table(rows: list[str]) -> list[str]:
    """A table of short cells: prose columns listed under the table by row, long cells wrapped or noted."""
    header, body = _cells(rows[0]), [_cells(r) for r in rows[2:]]
    if len(rows) < 2 or any(len(r) != len(header) for r in body):
        return rows  # not a table we wrote: left as it is
    align = _cells(rows[1])

    def prose(i: int) -> bool:
        long = sum(_width(r[i]) > TEXT_TAB_CELL_CHARS for r in body)
        return 2 * long >= len(body) > 0 and max(_width(r[i]) for r in body) > _PROSE_CELL_CHARS

    moved = [i for i in range(len(header)) if prose(i)]
    kept = [i for i in range(len(header)) if i not in moved] or [0]
    notes: list[str] = []
    below: list[str] = []
    new_body = []
    for r in body:
        cells = []
        for i in kept:
            if _width(r[i]) > _NOTE_CELL_CHARS:
                notes.append(f"{len(notes) + 1}. {r[i]}")
                cells.append(f"see note {len(notes)}")
            else:
                cells.append(_wrapped(r[i]))
        new_body.append(cells)
        if moved:
            label = max((r[i] for i in kept), key=_width)
            below += ["", f"**{label}**", ""] + [f"- {header[i]}: {r[i]}" for i in moved if r[i]]
    lines = ["| " + " | ".join(header[i] for i in kept) + " |", "|" + "|".join(align[i] for i in kept) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in new_body]
    return lines + below + (["", *notes] if notes else [])


def _wrapped(text: str) -> str:
    """A cell over :data:`TEXT_TAB_CELL_CHARS` as lines of at most that, joined by ``<br>``: before a
    parenthesis where there is one, else between words (never inside a code span)."""
    if _width(text) <= TEXT_TAB_CELL_CHARS:
        return text
    protected = _CODE_SPAN.sub(lambda m: m.group().replace(" ", "\0"), text)
    lines: list[str] = []
    for part in re.split(r" (?=\()", protected):
        wrapped = textwrap.wrap(part, TEXT_TAB_CELL_CHARS, break_long_words=False, break_on_hyphens=False)
        lines += wrapped or [part]
    return "<br>".join(lines).replace("\0", " ")
