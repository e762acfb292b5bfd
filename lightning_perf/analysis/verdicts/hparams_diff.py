"""The user's hyperparameters that differ between runs, beside the settings fingerprint.

The fingerprint records what lightning-perf reads from the Trainer and the DataLoader; a change made through the
user's own arguments (``batched_transforms=True``, a learning rate, a model width) shows only in the
hyperparameters Lightning saved (``hparams.yaml`` in the run's log dir, what ``save_hyperparameters()`` and the
Lightning CLI record). :func:`hparams_diffs` takes each run's hyperparameters as a plain dict (read by
:func:`lightning_perf.analysis.run_discovery.load_hparams`) and keeps the keys whose values differ, nested keys
joined with dots as Lightning flattens them for TensorBoard's HParams tab. Pure: no file I/O, no Lightning.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# Keys Lightning adds for itself, not the user's: the Lightning CLI's `_instantiator` and `_class_path`.
PRIVATE_PREFIX = "_"
# Shown for a key one run has and another lacks (absent, never a made-up default).
ABSENT = "(not set)"


def flatten(hparams: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"data": {"num_workers": 2}}`` -> ``{"data.num_workers": 2}``; private keys (``_...``) left out."""
    flat: dict[str, Any] = {}
    for key, value in hparams.items():
        name = str(key)
        if name.startswith(PRIVATE_PREFIX):
            continue
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{name}."))
        else:
            flat[f"{prefix}{name}"] = value
    return flat


def hparams_diffs(per_run: Sequence[Mapping[str, Any] | None]) -> dict[str, list[Any]]:
    """Key -> value per run (same order as ``per_run``) for every hyperparameter whose values differ.

    A run without saved hyperparameters (``None``) has no say: with fewer than two runs that have them, nothing
    can be told and the result is empty. A key one run lacks reads :data:`ABSENT` there.
    """
    flat = [None if h is None else flatten(h) for h in per_run]
    known = [f for f in flat if f is not None]
    if len(known) < 2:
        return {}
    keys = sorted({key for f in known for key in f})
    diffs: dict[str, list[Any]] = {}
    for key in keys:
        values = [None if f is None else f.get(key, ABSENT) for f in flat]
        present = [v for f, v in zip(flat, values, strict=True) if f is not None]
        if any(v != present[0] for v in present[1:]):
            diffs[key] = values
    return diffs


def text_rows(diffs: Mapping[str, Sequence[Any]]) -> list[list[str]]:
    """The text table's section: a title row, then one row a hyperparameter (``None``: the run saved none)."""
    if not diffs:
        return []
    return [["hyperparameters that differ"]] + [
        [f"  {key}", *("n/a" if v is None else str(v) for v in values)] for key, values in diffs.items()
    ]


def markdown_lines(diffs: Mapping[str, Sequence[Any]], names: Sequence[str]) -> list[str]:
    """The Markdown table of differing hyperparameters (``names``: the header cells of the runs), or nothing."""
    if not diffs:
        return []

    def cell(text: str) -> str:
        return "`" + text.replace("`", "'").replace("|", "\\|") + "`"

    lines = ["| hyperparameter | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 1)]
    for key, values in diffs.items():
        cells = ["n/a" if v is None else cell(str(v)) for v in values]
        lines.append(f"| {cell(key)} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def difference_labels(per_run: Sequence[Mapping[str, Any] | None], prefix: str = "perf/") -> list[str]:
    """A label per run from what differs between the runs (``num_workers=2, lr=0.02``), as
    ``compare --label-from-settings`` names runs the user did not name; ``prefix`` is left off the keys; ``""``
    for a run with nothing to tell (no values, or nothing differs)."""
    diffs = hparams_diffs(per_run)
    labels = []
    for index, run in enumerate(per_run):
        parts = [f"{key.removeprefix(prefix)}={values[index]}" for key, values in diffs.items()]
        labels.append(", ".join(parts) if run is not None else "")
    return labels
