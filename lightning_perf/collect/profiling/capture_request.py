"""On-demand traces: ``lightning-perf capture RUN_DIR`` leaves a request file in the run dir, the running fit
takes it at its next logging window and records one profiler cycle.

Plain files only, so it works wherever the run dir is reachable: a login node of a SLURM cluster, a shell in
the container, another machine on the shared file system. The request is JSON (decoded with msgspec, typed):
``{"schema": "lightning-perf/capture-request", "version": 1, "requested_at": <unix seconds>, "by": "host:pid"}``.
Rank zero looks for it at each logging window (one ``stat`` when there is none) and removes it once read. A
request written before the run started (left over from an earlier run in the same dir) or older than
:data:`MAX_AGE_S`, or one that cannot be decoded, is ignored with one warning and removed.
"""

from __future__ import annotations

import os
import socket
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
        self._ignored: tuple[int, int] | None = None  # (mtime_ns, size) of a bad request we could not remove

    def take(self, now: float | None = None) -> CaptureRequest | None:
        """The pending request, removed from the dir; None when there is none or it is ignored (warned)."""
        if self.path is None:
            return None
        try:
            stat = os.stat(self.path)
        except OSError:
            return None  # the usual case: no request
        if self._ignored == (stat.st_mtime_ns, stat.st_size):
            return None
        now = time.time() if now is None else now
        problem, request = self._read(stat.st_size)
        if request is not None:
            age = now - request.requested_at
            if request.requested_at < self.started - CLOCK_SKEW_S:
                problem = "it was written before this run started (left over from an earlier run?)"
            elif age > MAX_AGE_S:
                problem = (
                    f"it is {age / 60:.0f} minutes old (requests older than {MAX_AGE_S / 60:.0f} are stale)"
                )
        remove_quietly(self.path)
        if os.path.exists(self.path):
            self._ignored = (stat.st_mtime_ns, stat.st_size)
        if problem is not None:
            log.warning(f"lightning-perf: ignoring the capture request {self.path}: {problem}")
            return None
        return request

    def _read(self, size: int) -> tuple[str | None, CaptureRequest | None]:
        if size > MAX_REQUEST_BYTES:
            return f"{size} bytes is not a capture request", None
        try:
            with open(self.path, "rb") as fh:  # type: ignore[arg-type]
                request = msgspec.json.decode(fh.read(), type=CaptureRequest)
        except OSError as err:
            return f"it cannot be read ({err.strerror or err})", None
        except msgspec.DecodeError as err:
            return f"it is malformed ({err}); write it with `lightning-perf capture RUN_DIR`", None
        if request.schema != REQUEST_SCHEMA or request.version != REQUEST_VERSION:
            return f"schema {request.schema!r} version {request.version} is not {REQUEST_SCHEMA!r} 1", None
        return None, request
