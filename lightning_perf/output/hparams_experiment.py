"""The HParams tab's one experiment for the runs of a log folder, rewritten as each run ends.

TensorBoard takes the tab's columns from the first experiment summary it finds (see
:mod:`lightning_perf.output.hparams_tab`), so there is one, in the folder that holds the runs (a TensorBoardLogger's
``root_dir``: ``lightning_logs/`` above ``version_0``, ``version_1``, ...). Each run leaves its values in
``perf_hparams.json``; at the end of a fit the experiment is computed from every run's file there and its event
file replaced (a new file, then the old one removed), so a TensorBoard started afterwards shows the columns that
tell the runs apart. A TensorBoard already running keeps the columns it read first (its data server keeps a
series' first metadata); reloading it shows the new ones.
"""

from __future__ import annotations

import glob
import json
import os
import socket
import stat
import time
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from lightning_perf import console
from lightning_perf.atomic_file import atomic_open, atomic_path
from lightning_perf.output import hparams_tab

log = console.logger(__name__)

VALUES_FILENAME = "perf_hparams.json"
EVENT_FILE_ENDING = ".lightning-perf-hparams"
# the runs looked at, newest first: the end of a fit stays well under a second in a folder of many runs
MAX_RUNS = 200
# a values file is a few hundred bytes; a larger one is not ours and is read no further
MAX_VALUES_BYTES = 1 << 20


def save_values(run_dir: str, values: Mapping[str, Any], metric_tags: Sequence[str]) -> None:
    """This run's values and metric tags, for the experiment of its folder."""
    with atomic_open(os.path.join(run_dir, VALUES_FILENAME), encoding="utf-8") as fh:
        json.dump({"values": dict(values), "metrics": list(metric_tags)}, fh, allow_nan=False)


def runs_values(root_dir: str) -> list[dict[str, Any]]:
    """The saved values of the runs in ``root_dir`` (its sub-folders), newest first; unreadable ones skipped."""
    paths = glob.glob(os.path.join(glob.escape(root_dir), "*", VALUES_FILENAME))
    paths.sort(key=_modified, reverse=True)
    found = (read_values(path) for path in paths[:MAX_RUNS])
    return [data for data in found if data is not None]


def read_values(path: str) -> dict[str, Any] | None:
    """One run's saved file (``{"values": {...}, "metrics": [...]}``, a few hundred bytes); None when missing or
    not of that form."""
    try:
        data = msgspec.json.decode(_read_regular(path, MAX_VALUES_BYTES))
    except (
        OSError,
        msgspec.DecodeError,
        RecursionError,
    ) as err:  # RecursionError: nested past msgspec's limit
        log.debug("lightning-perf: skipped %s for the HParams columns: %s", path, err)
        return None
    if (
        isinstance(data, dict)
        and isinstance(data.get("values"), dict)
        and isinstance(data.get("metrics"), list)
    ):
        return data
    log.debug("lightning-perf: skipped %s for the HParams columns: not a values file", path)
    return None


def _read_regular(path: str, limit: int) -> bytes:
    """At most ``limit`` bytes of the regular file ``path``. Opened without blocking and checked once open: the
    file lies in a sibling run's folder, and a FIFO there would hang the end of this fit (and a Perf tab request)
    until a writer came."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path}: not a regular file")
        return fh.read(limit)


def write_experiment(root_dir: str, metric_names: Mapping[str, tuple[str, str]]) -> str | None:
    """Rewrite the experiment of the runs in ``root_dir``; the event file's path, or None without runs."""
    runs = runs_values(root_dir)
    if not runs:
        return None
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    summary = hparams_tab.experiment_summary(
        [run["values"] for run in runs], [tag for run in runs for tag in run["metrics"]], metric_names
    )
    old = glob.glob(os.path.join(glob.escape(root_dir), f"events.out.tfevents.*{EVENT_FILE_ENDING}"))
    now = time.time()
    path = os.path.join(root_dir, f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}")
    path += EVENT_FILE_ENDING
    # the temporary name holds no "tfevents": TensorBoard never reads the file half written
    with atomic_path(path, stem="lightning-perf-hparams") as partial, open(partial, "wb") as fh:
        writer = RecordWriter(fh)
        writer.write(Event(wall_time=now, file_version="brain.Event:2").SerializeToString())
        writer.write(Event(wall_time=now, step=0, summary=summary).SerializeToString())
    for stale in old:
        if stale != path:
            try:
                os.remove(stale)
            except OSError as err:  # another run's end removed it first
                log.debug("lightning-perf: could not remove %s: %s", stale, err)
    return path


def _modified(path: str) -> float:
    try:
        return os.path.getmtime(path)
    except OSError:
        return 0.0
