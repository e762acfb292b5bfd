"""On-demand traces: ``lightning-perf capture RUN_DIR`` leaves a request file in the run dir, the running fit
takes it at its next logging window and records one profiler cycle.

Plain files only, so it works wherever the run dir is reachable: a login node of a SLURM cluster, a shell in
the container, another machine on the shared file system. The request is JSON (decoded with msgspec, typed):
``{"schema": "lightning-perf/capture-request", "version": 1, "requested_at": <unix seconds>, "by": "host:pid"}``.
Rank zero looks for it at each logging window (one ``lstat`` when there is none) and removes it once read. A
request written before the run started (left over from an earlier run in the same dir) or older than
:data:`MAX_AGE_S`, or one that cannot be decoded, is ignored with one warning and removed.

Only a regular file is read, and no more than :data:`MAX_REQUEST_BYTES` of it: the name is looked at with
``lstat``, opened with ``O_NOFOLLOW | O_NONBLOCK`` (where the platform has them) and checked again with
``fstat`` on the open file. A symbolic link (to ``/dev/zero``, say: a device reports size 0 and never ends), a
FIFO (opening one for reading waits for a writer; reading it, for data), a device, a socket or a folder under
that name is ignored with one warning naming it and what it is, and removed where it can be (a link is
removed, never what it points to). The training thread never blocks on it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import time

import msgspec

from lightning_perf import console
from lightning_perf.atomic_file import atomic_open, remove_quietly

log = console.logger(__name__)

REQUEST_FILENAME = "perf_capture_request.json"
REQUEST_SCHEMA = "lightning-perf/capture-request"
REQUEST_VERSION = 1
# A request not taken within this long found no run watching (stopped, or windows hours apart): ignored then.
MAX_AGE_S = 1800.0
# Clocks of the machine that wrote the request and of the one training may differ by this much (NTP keeps
# cluster nodes far closer; a minute covers a container without time sync).
CLOCK_SKEW_S = 60.0
# A request file larger than this is not one of ours (a real one is ~100 bytes).
MAX_REQUEST_BYTES = 4096
# open(2) flags: never follow a link (a name swapped for one after the lstat fails to open), never wait (a FIFO
# swapped in opens at once, then fails the fstat check); 0 where the platform lacks one (Windows)
_OPEN_FLAGS = (
    os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
)


class CaptureRequest(msgspec.Struct, forbid_unknown_fields=False):
    schema: str
    version: int
    requested_at: float
    by: str = ""


def request_path(run_dir: str) -> str:
    return os.path.join(run_dir, REQUEST_FILENAME)


def write_request(run_dir: str, now: float | None = None) -> str:
    """Write a request into ``run_dir`` (atomically: a fit never reads half of it); returns its path."""
    request = CaptureRequest(
        schema=REQUEST_SCHEMA,
        version=REQUEST_VERSION,
        requested_at=time.time() if now is None else now,
        by=f"{socket.gethostname()}:{os.getpid()}",
    )
    path = request_path(run_dir)
    with atomic_open(path, "wb") as fh:
        fh.write(msgspec.json.encode(request))
    return path


class RequestInbox:
    """Where one run looks for capture requests; ``started`` is the run's start (``time.time()``)."""

    def __init__(self, run_dir: str | None, started: float) -> None:
        self.path = request_path(run_dir) if run_dir else None
        self.started = started
        # (inode, mode, mtime_ns, size) of a bad request we could not remove
        self._ignored: tuple[int, int, int, int] | None = None

    def take(self, now: float | None = None) -> CaptureRequest | None:
        """The pending request, removed from the dir; None when there is none or it is ignored (warned)."""
        if self.path is None:
            return None
        try:
            found = os.lstat(self.path)  # the name itself: a link is not followed
        except OSError:
            return None  # the usual case: no request
        identity = (found.st_ino, found.st_mode, found.st_mtime_ns, found.st_size)
        if self._ignored == identity:
            return None
        now = time.time() if now is None else now
        problem, request = self._read(found)
        if request is not None:
            age = now - request.requested_at
            if request.requested_at < self.started - CLOCK_SKEW_S:
                problem = "it was written before this run started (left over from an earlier run?)"
            elif age > MAX_AGE_S:
                problem = (
                    f"it is {age / 60:.0f} minutes old (requests older than {MAX_AGE_S / 60:.0f} are stale)"
                )
        remove_quietly(self.path)  # a link itself, never its target; a folder stays (and is not told twice)
        if os.path.lexists(self.path):
            self._ignored = identity
        if problem is not None:
            log.warning(f"lightning-perf: ignoring the capture request {self.path}: {problem}")
            return None
        return request

    def _read(self, found: os.stat_result) -> tuple[str | None, CaptureRequest | None]:
        assert self.path is not None
        if not stat.S_ISREG(found.st_mode):
            return self._not_a_file(found.st_mode), None
        if found.st_size > MAX_REQUEST_BYTES:
            return f"{found.st_size} bytes is not a capture request", None
        try:
            fd = os.open(self.path, _OPEN_FLAGS)
        except OSError as err:  # e.g. ELOOP: swapped for a link since the lstat
            try:
                now_there = os.lstat(self.path).st_mode
            except OSError:
                now_there = found.st_mode
            if not stat.S_ISREG(now_there):
                return self._not_a_file(now_there), None
            return f"it cannot be read ({err.strerror or err})", None
        try:
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode):  # swapped since the lstat
                return self._not_a_file(opened.st_mode), None
            content = read_at_most(fd, MAX_REQUEST_BYTES + 1)
        except OSError as err:
            return f"it cannot be read ({err.strerror or err})", None
        finally:
            os.close(fd)
        if len(content) > MAX_REQUEST_BYTES:
            return f"it holds over {MAX_REQUEST_BYTES} bytes: not a capture request", None
        try:
            request = msgspec.json.decode(content, type=CaptureRequest)
        except msgspec.DecodeError as err:
            return f"it is malformed ({err}); write it with `lightning-perf capture RUN_DIR`", None
        if request.schema != REQUEST_SCHEMA or request.version != REQUEST_VERSION:
            return f"schema {request.schema!r} version {request.version} is not {REQUEST_SCHEMA!r} 1", None
        return None, request

    def _not_a_file(self, mode: int) -> str:
        what = file_kind(mode)
        if stat.S_ISLNK(mode) and self.path is not None:
            with contextlib.suppress(OSError):
                what += f" to {os.readlink(self.path)!r}"
        return f"it is {what}, not a regular file (`lightning-perf capture RUN_DIR` writes a plain file)"


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words."""
    kinds = (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISREG, "a regular file"),
    )
    return next((name for test, name in kinds if test(mode)), f"a special file (mode {mode:o})")


def read_at_most(fd: int, limit: int) -> bytes:
    """Up to ``limit`` bytes from ``fd`` (fewer at its end)."""
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = os.read(fd, left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
