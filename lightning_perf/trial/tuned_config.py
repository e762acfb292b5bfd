"""The tuned config: the user's Lightning CLI config with the chosen changes, written beside it.

``CFG.yaml`` is only read, never written: the result goes to ``CFG.tuned.yaml`` (atomically), and the diff
between the two (both as YAML dumps, so only the changed keys show) is returned for printing. YAML comments of
the original are not carried over (PyYAML does not keep them). :func:`check_tuned_output` runs before any fit:
an existing ``CFG.tuned.yaml`` is replaced only when asked (``--overwrite``), and a folder that cannot take the
file is named, with its errno, before minutes of rounds are spent.
"""

from __future__ import annotations

import copy
import difflib
import errno
import os
from typing import Any

from lightning_perf.atomic_file import atomic_open, describe_os_error, probe_write
from lightning_perf.trial.spec import TrialError

TUNED_SUFFIX = ".tuned"


def tuned_path(config_path: str) -> str:
    """``dir/cfg.yaml`` -> ``dir/cfg.tuned.yaml``."""
    stem, ext = os.path.splitext(config_path)
    return f"{stem}{TUNED_SUFFIX}{ext or '.yaml'}"


def check_tuned_output(config_path: str, overwrite: bool) -> str:
    """The tuned config's path, once sure it can be written: no file there unless ``overwrite``, and its folder
    takes a new file (a real one, made and removed: a read-only file system or an immutable folder fails
    here as the write would, where a permission check alone would pass for root)."""
    path = tuned_path(config_path)
    if os.path.isdir(path):
        raise TrialError(f"cannot write the tuned config {path}: it is a directory (EISDIR); move it away")
    if os.path.lexists(path) and not overwrite:
        raise TrialError(
            f"{path} already exists (an earlier tune's result, or a file of yours) and tune writes its result "
            "there; pass --overwrite to replace it, or move it away"
        )
    folder = os.path.dirname(os.path.abspath(path))
    try:
        probe_write(folder)
    except OSError as err:
        raise TrialError(
            f"cannot write the tuned config {path}: its folder {folder} is not writable ({describe_os_error(err)}); "
            "make it writable or tune a copy of the config in a folder you can write"
        ) from None
    return path


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


def write_tuned(config_path: str, changes: dict[str, Any], overwrite: bool = True) -> tuple[str, str]:
    """Write ``CFG.tuned.yaml`` with ``changes``; returns its path and a unified diff against the original.

    Raises:
        OSError: the file could not be written (its ``filename`` is the tuned config's path); ``EEXIST`` when
            one appeared there since the check and ``overwrite`` is off.
    """
    import yaml

    with open(config_path, encoding="utf-8") as fh:
        original = yaml.safe_load(fh) or {}
    tuned = apply_changes(original, changes)
    path = tuned_path(config_path)
    text = _dump(tuned)
    if not overwrite and os.path.lexists(path):
        raise FileExistsError(errno.EEXIST, "it exists and --overwrite was not given", path)
    try:
        with atomic_open(path) as fh:
            fh.write(text)
    except OSError as err:
        err.filename = path  # the temporary name the failing call saw is nobody's concern
        raise
    diff = "".join(
        difflib.unified_diff(
            _dump(original).splitlines(keepends=True),
            text.splitlines(keepends=True),
            fromfile=config_path,
            tofile=path,
        )
    )
    return path, diff
