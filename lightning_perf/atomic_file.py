"""Crash-safe files: everything lightning-perf writes appears under its final name complete, or not at all.

A file is written to a hidden temporary name in the same directory (so the rename stays on one file system
and is atomic) and renamed into place only when the writer finished without error; on any error (a full
disk, a read-only or unwritable directory, an interrupt) the temporary file is removed and the error goes
on to the caller. The temporary name never ends like the final one (``.<name>.<random>.partial``), so
TensorBoard scanning the folder never picks up half a trace.

Standard library only; the bottom of the package next to :mod:`lightning_perf.errors`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import tempfile
from collections.abc import Iterator
from typing import IO, Any

TEMP_SUFFIX = ".partial"
# Errors that the next write to the same directory will meet again: after one of them, later writes of the
# same kind (profiling cycles) are skipped instead of failing once more per cycle.
PERSISTENT_ERRNOS = frozenset(
    code for code in (errno.ENOSPC, getattr(errno, "EDQUOT", None), errno.EROFS, errno.EACCES) if code
)


def temporary_name(path: str, ending: str = "", stem: str | None = None) -> str:
    """The hidden temporary name :func:`atomic_path` writes ``path`` under (``ending`` appended); ``stem`` in
    place of the final name where that name must not show in it (an event file's "tfevents")."""
    directory, name = os.path.split(path)
    return os.path.join(
        directory, f".{stem or name}.{os.getpid()}-{secrets.token_hex(3)}{TEMP_SUFFIX}{ending}"
    )


def remove_quietly(*paths: str) -> None:
    """Remove files that may or may not exist; a failure to remove is not worth a second error."""
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], ending: str = "", stem: str | None = None) -> Iterator[str]:
    """A temporary path to write ``path``'s content to; renamed to ``path`` when the block ends cleanly::

        with atomic_path("out.png") as tmp:
            figure.savefig(tmp, format="png")

    On any exception (``KeyboardInterrupt`` included) the temporary file is removed and the exception
    propagates; the final name keeps whatever it held before (or nothing). ``ending`` is for writers that
    choose the format by the file name's ending (``".html"``); ``stem`` replaces the final name in the temporary
    one, for readers that pick files by a part of their name (TensorBoard's "tfevents").
    """
    path = os.fspath(path)
    tmp = temporary_name(path, ending, stem)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w", **kwargs: Any) -> Iterator[IO[Any]]:
    """``open(path, mode)`` that writes to a temporary name and renames on a clean close (see above)."""
    text = "b" not in mode
    if text:
        kwargs.setdefault("encoding", "utf-8")
    with atomic_path(path) as tmp, open(tmp, mode, **kwargs) as handle:  # noqa: PTH123
        yield handle


def describe_os_error(err: BaseException) -> str:
    """``ENOSPC (No space left on device)``: the symbol people search for, and the words."""
    code = getattr(err, "errno", None)
    symbol = errno.errorcode.get(code) if isinstance(code, int) else None
    words = getattr(err, "strerror", None) or str(err)
    return f"{symbol} ({words})" if symbol else words


def is_persistent(err: BaseException) -> bool:
    """True for an OSError that later writes to the same place will meet again (full disk, read-only...)."""
    return isinstance(err, OSError) and err.errno in PERSISTENT_ERRNOS


# Below this much free space a directory counts as full: a trace cycle writes megabytes.
FULL_DISK_BYTES = 1 << 20


def why_unwritable(directory: str) -> OSError | None:
    """The error a write into ``directory`` meets, found without writing: for writers that fail without
    saying why (Kineto logs "Failed to write" and returns). ``None`` when nothing is visibly wrong."""
    try:
        stats = os.statvfs(directory)
    except OSError as err:
        return err
    if stats.f_flag & os.ST_RDONLY:
        code = errno.EROFS
    elif not os.access(directory, os.W_OK):
        code = errno.EACCES
    elif stats.f_bavail * stats.f_frsize < FULL_DISK_BYTES:
        code = errno.ENOSPC
    else:
        return None
    return OSError(code, os.strerror(code), directory)


def probe_write(directory: str) -> None:
    """Create and remove a file in ``directory``, raising the OSError a real write meets: ``os.access`` is not
    enough, root passes it where a read-only mount or ``chattr +i`` refuses."""
    handle, probe = tempfile.mkstemp(prefix=".lightning-perf.", suffix=".check", dir=directory)
    os.close(handle)
    os.unlink(probe)
