"""Finding runs and loading their summaries: what ``compare`` and ``trial`` read from disk."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

from lightning_perf.analysis.summary import SUMMARY_FILENAME, RunSummary
from lightning_perf.analysis.verdicts.comparison import CompareError, check_summary

# Where Lightning's loggers (TensorBoard, CSV) save a run's hyperparameters: beside perf_summary.json.
HPARAMS_FILENAME = "hparams.yaml"


def natural_key(text: str) -> list[Any]:
    """Sort key that orders digit runs by value: ``version_2`` before ``version_10``."""
    return [int(part) if part.isdigit() else part.lower() for part in re.split(r"(\d+)", text)]


def _runs_under(path: str) -> list[str]:
    """Run dirs for one command-line path: the run itself, or every dir below a log root holding a summary."""
    if not os.path.exists(path):
        raise CompareError(f"{path}: no such file or directory")
    if os.path.isfile(path):
        if os.path.basename(path) != SUMMARY_FILENAME:
            raise CompareError(f"{path}: not a run directory or a {SUMMARY_FILENAME} file")
        return [os.path.dirname(path) or "."]
    if os.path.exists(os.path.join(path, SUMMARY_FILENAME)):
        return [path]

    def unreadable(err: OSError) -> None:
        raise CompareError(f"{err.filename}: cannot search for runs: {err.strerror}")

    found = [d for d, _, files in os.walk(path, onerror=unreadable) if SUMMARY_FILENAME in files]
    if not found:
        raise CompareError(
            f"{path}: no {SUMMARY_FILENAME} in this directory or below it "
            "(give a run's log dir or a log root holding runs)"
        )
    return sorted(found, key=lambda d: natural_key(os.path.relpath(d, path).replace(os.sep, "/")))


def common_root(directories: Sequence[str]) -> str:
    """The deepest directory holding all ``directories``."""
    return os.path.commonpath([os.path.abspath(d) for d in directories])


def run_names(directories: Sequence[str]) -> list[str]:
    """Each run's path relative to the runs' common root, e.g. ``version_0`` or ``baseline``."""
    root = common_root(directories)
    names = []
    for directory in directories:
        absolute = os.path.abspath(directory)
        relative = os.path.relpath(absolute, root)
        names.append(os.path.basename(absolute) if relative == "." else relative.replace(os.sep, "/"))
    if len(set(names)) != len(names):  # e.g. a root that is itself a run and holds one of the same name
        names = [os.path.abspath(d) for d in directories]
    return names


def find_runs(paths: Sequence[str]) -> list[tuple[str, str]]:
    """``(name, run_dir)`` for every run the paths name, in order; a dir reached twice counts once."""
    directories: list[str] = []
    seen: set[str] = set()
    for path in paths:
        for directory in _runs_under(path):
            key = os.path.realpath(directory)
            if key not in seen:
                seen.add(key)
                directories.append(directory)
    return list(zip(run_names(directories), directories, strict=True))


def baseline_index(runs: list[tuple[str, str]], baseline: str) -> int | None:
    """Index of the run ``baseline`` names (by name, then by path); None for a run path not among ``runs``."""
    names = [name for name, _ in runs]
    if baseline in names:
        return names.index(baseline)
    if os.path.exists(baseline):
        targets = _runs_under(baseline)
        if len(targets) != 1:
            raise CompareError(f"--baseline {baseline}: holds {len(targets)} runs, expected one")
        target = os.path.realpath(targets[0])
        for i, (_, directory) in enumerate(runs):
            if os.path.realpath(directory) == target:
                return i
        return None
    raise CompareError(f"--baseline {baseline!r}: no run has that name or path; runs: {', '.join(names)}")


def load_summary(directory: str, allow_partial: bool = False) -> RunSummary:
    """Load and check one run's summary; errors name the file."""
    path = os.path.join(directory, SUMMARY_FILENAME)
    summary = RunSummary.load(path)
    try:
        check_summary(summary)
    except ValueError as err:
        raise CompareError(f"{path}: malformed run summary: {err}") from None
    if summary.timing.steps == 0 and not allow_partial:
        raise CompareError(
            f"{path}: partial run summary: no training steps were timed (status {summary.status!r}); "
            "pass --allow-partial to compare it anyway"
        )
    return summary


def load_hparams(directory: str) -> dict[str, Any] | None:
    """The hyperparameters Lightning saved in the run's ``hparams.yaml``; None when there is none or it cannot be
    read (they are optional: a comparison goes on without them). Python-specific YAML tags (``!!python/tuple``,
    objects Lightning could dump) are read as their plain data, never executed; one whose aliases expand past the
    YAML node budget (:mod:`lightning_perf.yaml_budget`) is not read."""
    import yaml

    from lightning_perf.yaml_budget import YamlBudgetError, load_yaml_file

    class _PlainLoader(yaml.SafeLoader):
        pass

    def plain(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
        if isinstance(node, yaml.MappingNode):
            return loader.construct_mapping(node, deep=True)
        if isinstance(node, yaml.SequenceNode):
            return loader.construct_sequence(node, deep=True)
        return loader.construct_scalar(node)

    _PlainLoader.add_multi_constructor("", plain)
    try:
        data = load_yaml_file(os.path.join(directory, HPARAMS_FILENAME), loader=_PlainLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, YamlBudgetError, RecursionError):
        return None
    return data if isinstance(data, dict) else None
