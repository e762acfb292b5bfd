"""Markdown for TensorBoard's Text tab, ``compare --format markdown`` and ``report --format markdown``.

Written here once (no library is kept for it: the tables are three lines of string joining, and every writer
needs the same escaping).
"""

from __future__ import annotations

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
