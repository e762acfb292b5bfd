"""The metric table of docs/metrics.md, generated from the tag registry (:mod:`lightning_perf.analysis.metrics`).

``python -m lightning_perf.analysis.metrics_table docs/metrics.md`` rewrites the table between the page's
``<!-- metrics:start -->`` and ``<!-- metrics:end -->`` markers; ``tests/test_readme.py`` fails when they disagree.
"""

from __future__ import annotations

import sys

from lightning_perf.analysis import metrics

_WHEN = {
    "window": "each window",
    "summary": "end of fit: HParams",
    "text": "end of fit: Text tab",
    "image": "end of fit: Images tab",
}


def markdown_table() -> str:
    """The metric table (between its ``<!-- metrics:start -->`` and ``<!-- metrics:end -->``)."""
    from lightning_perf.analysis.markdown import table

    rows = []
    for m in metrics.METRICS:
        rows.append([f"`{m.tag}`", m.when or _WHEN[m.kind], m.unit, m.meaning])
        if m is metrics.SLOWEST_RANK:  # the DDP maxima sit after the slowest rank they go with
            tags = ", ".join(f"`{metrics.max_tag(r)}`" for r in metrics.ACROSS_RANKS)
            meaning = "under DDP: the slowest rank's value; the un-suffixed tags are then the mean over ranks"
            rows.append([tags, "each window", "", meaning])
    return "\n".join(table(["tag", "logged", "unit", "meaning"], rows)) + "\n"


TABLE_START = "<!-- metrics:start -->"
TABLE_END = "<!-- metrics:end -->"


def readme_table(readme: str) -> str:
    """The metric table currently between the markers of a page's text."""
    start, end = readme.index(TABLE_START) + len(TABLE_START), readme.index(TABLE_END)
    return readme[start:end].strip("\n") + "\n"


def with_table(readme: str) -> str:
    """The page's text with the table between its markers regenerated from the registry."""
    start, end = readme.index(TABLE_START) + len(TABLE_START), readme.index(TABLE_END)
    return readme[:start] + "\n" + markdown_table() + readme[end:]


if __name__ == "__main__":  # python -m lightning_perf.analysis.metrics_table docs/metrics.md
    for path in sys.argv[1:]:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(with_table(text))
