"""What the Perf tab may list and open: regular files inside a run folder, run folders inside the log dir.

TensorBoard serves the tab to whoever reaches its port (the whole network with ``--bind_all``), and a run folder
is written by training code, often on a shared file system: it may hold a symlink to ``~/.ssh/id_rsa`` or
``/proc/self/environ``, a FIFO (opening one blocks the reader until a writer comes: a hung request) or a device.
Every path the tab lists or opens passes :func:`refusal` first, which looks at it without opening it.
"""

from __future__ import annotations

import os
import stat


class UnknownRun(LookupError):
    """A run or file name the tab did not list (a stale page, a hand-made URL, a file it refuses to serve)."""


def is_inside(path: str, folder: str) -> bool:
    """Whether ``path``, symlinks resolved, lies in ``folder`` (symlinks resolved too) or is that folder."""
    real_folder = os.path.realpath(folder)
    return os.path.commonpath([os.path.realpath(path), real_folder]) == real_folder


def refusal(folder: str, path: str) -> str | None:
    """Why the tab must neither list nor open ``path`` (one line, naming no target), or None when it may: a
    regular file whose real path lies inside ``folder``'s (a symlink to a file beside it is fine; one out of
    the folder is not followed). ``stat`` only, never ``open``: a FIFO would hang the request."""
    if not is_inside(path, folder):
        return "outside the run folder (a symlink out of it is not followed)"
    try:
        mode = os.stat(os.path.realpath(path)).st_mode
    except OSError as err:  # a dangling symlink, a loop, a file just removed
        return f"cannot be looked at ({err.strerror or err}), not read"
    if stat.S_ISREG(mode):
        return None
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))
    kind = next((word for test, word in kinds if test(mode)), "a device")
    return f"{kind}, not a regular file: not read"


def checked(folder: str, name: str) -> str:
    """The path of ``name`` in the run ``folder`` when the tab may open it; :class:`UnknownRun` saying why not."""
    path = os.path.join(folder, name)
    why = refusal(folder, path)
    if why is not None:
        raise UnknownRun(f"{name}: {why}")
    return path
