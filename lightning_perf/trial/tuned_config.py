"""The tuned config: the user's Lightning CLI config with the chosen changes, written beside it.

``CFG.yaml`` is only read, never written: the result goes to ``CFG.tuned.yaml`` (atomically), and the diff
between the two (both as YAML dumps, so only the changed keys show) is returned for printing. YAML comments of
the original are not carried over (PyYAML does not keep them).
"""

from __future__ import annotations

import copy
import difflib
import os
from typing import Any

from lightning_perf.atomic_file import atomic_open

TUNED_SUFFIX = ".tuned"


def tuned_path(config_path: str) -> str:
    """``dir/cfg.yaml`` -> ``dir/cfg.tuned.yaml``."""
    stem, ext = os.path.splitext(config_path)
    return f"{stem}{TUNED_SUFFIX}{ext or '.yaml'}"


def apply_changes(config: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` with each dotted key (``data.init_args.num_workers``) set, sections made as needed."""
    result = copy.deepcopy(config)
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = result
        for part in parents:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {} if child is None else {"class_path": child} if isinstance(child, str) else {}
                node[part] = child
            node = child
        node[last] = value
    return result


def _dump(config: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(config, sort_keys=False, default_flow_style=False)


def write_tuned(config_path: str, changes: dict[str, Any]) -> tuple[str, str]:
    """Write ``CFG.tuned.yaml`` with ``changes``; returns its path and a unified diff against the original."""
    import yaml

    with open(config_path, encoding="utf-8") as fh:
        original = yaml.safe_load(fh) or {}
    tuned = apply_changes(original, changes)
    path = tuned_path(config_path)
    text = _dump(tuned)
    with atomic_open(path) as fh:
        fh.write(text)
    diff = "".join(
        difflib.unified_diff(
            _dump(original).splitlines(keepends=True),
            text.splitlines(keepends=True),
            fromfile=config_path,
            tofile=path,
        )
    )
    return path, diff
