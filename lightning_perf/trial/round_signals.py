"""SIGINT, SIGTERM and SIGHUP during a trial round: the round's whole process group goes first, then the parent.

The round's worker runs in its own session and process group with its DataLoader workers
(:func:`lightning_perf.trial.runner.run_worker`); a terminal's Ctrl-C reaches only the parent's group. While a
round runs, each of these signals SIGKILLs the worker's group at once, then does what it did before (SIGINT:
``KeyboardInterrupt``; a Python handler: called), else ends the parent with :class:`Terminated`. At once, with no
polite signal and grace first: the interrupted round is dropped anyway, and a worker whose DataLoader workers are
stalled in ``__getitem__`` (a hung file system, a crowded machine) would not act on SIGINT or SIGTERM within
any grace (Lightning stops at its next step, which never comes), so a grace would only delay the exit.
A signal that lands while the worker is being started (between fork and Popen's return, the worker's pid not
known yet) is held until its pid is, then acted on: acted on at once it would kill nothing and leave the worker,
and the DataLoader workers it starts, running. Pure standard library.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

# the signals that end a round's process group before the parent goes
ENDING_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


class Terminated(SystemExit):
    """SIGTERM or SIGHUP reached the parent during a round: the worker's process group was killed first; the
    parent exits with 128 + the signal (143 for SIGTERM), as a shell reports a process ended by it."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


class RoundGuard:
    """The round's worker once started (:meth:`started`), and a signal held while it was being started."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None
        self.held: tuple[int, Any] | None = None
        self._act: Any = None  # the guard's signal action, once installed

    def started(self, proc: subprocess.Popen[str]) -> None:
        """The worker is running as ``proc``: a signal held while it started ends its group now."""
        self.proc = proc
        held, self.held = self.held, None
        if held is not None and self._act is not None:
            self._act(*held)


def kill_group(proc: subprocess.Popen[str], posix: bool = True) -> None:
    """SIGKILL the worker's process group (its DataLoader workers too); the worker alone where there is none."""
    if proc.returncode is not None:
        return  # reaped: its number may be another process's now
    try:
        if posix:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except (ProcessLookupError, PermissionError):
        pass  # already gone


@contextlib.contextmanager
def group_ended_on_signals() -> Iterator[RoundGuard]:
    """While a round runs, :data:`ENDING_SIGNALS` kill the worker's process group first (see the module).
    Signals the parent ignores (``nohup``) stay ignored; outside the main thread nothing is installed."""
    guard = RoundGuard()
    if os.name != "posix" or threading.current_thread() is not threading.main_thread():
        yield guard
        return
    previous: dict[int, Any] = {}

    def act(signum: int, frame: Any) -> None:
        if guard.proc is not None:
            kill_group(guard.proc)
        old = previous.get(signum)
        if callable(old):
            old(signum, frame)
            return
        name = signal.Signals(signum).name
        with contextlib.suppress(OSError, ValueError):
            print(
                f"lightning-perf: {name}: the running worker and its processes were stopped", file=sys.stderr
            )
        raise Terminated(signum)

    def handler(signum: int, frame: Any) -> None:
        if guard.proc is None:  # the worker is being started: act once its pid is known (RoundGuard.started)
            guard.held = guard.held or (signum, frame)
            return
        act(signum, frame)

    for name in ENDING_SIGNALS:
        signum = getattr(signal, name, None)
        old = signal.getsignal(signum) if signum is not None else None
        if signum is None or old is None or old == signal.SIG_IGN:
            continue  # ignored (nohup) or set outside Python: left alone
        previous[signum] = old
        signal.signal(signum, handler)
    guard._act = act
    try:
        yield guard
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
        held, guard.held = guard.held, None
        if held is not None:  # the worker never started (Popen failed): the signal still ends the parent
            act(*held)
