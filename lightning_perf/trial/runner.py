"""Running one ``lightning-perf trial`` worker process: the line protocol, a timeout, a one-line error.

The worker (``lightning_perf.trial.worker``) prints protocol lines on stdout for the parent (``progress K N``,
``done``, ``error MESSAGE``); all its other output goes to a log file only. A worker that hangs past its
timeout, or whose parent is interrupted, is killed with its whole process group (its DataLoader workers).
Pure standard library: the parent never imports Lightning.
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO

# lines the worker prints for the parent start with this; everything else goes to the worker's log only
PROTOCOL_PREFIX = "@@lightning-perf-trial@@ "
# a failed variant's error is shown on one line, cut to this length (the full text is in the worker's log)
MAX_ERROR_CHARS = 400
# seconds to wait for a killed worker's output pipe to close
KILL_WAIT_S = 10.0
# seconds between checks whether the worker has exited while its output pipe stays open (left-over children)
POLL_S = 0.5


def protocol_line(kind: str, text: str = "") -> str:
    """A line the worker prints for the parent: ``progress K N``, ``error MESSAGE`` or ``done``."""
    return f"{PROTOCOL_PREFIX}{kind} {text}".rstrip()


def describe_error(err: BaseException) -> str:
    """One line for a variant's failure: the exception type and message, a parser error's useful part."""
    text = str(err)
    if isinstance(err, argparse.ArgumentError):
        return _clip("invalid config or override: " + _compact_parser_error(text))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return _clip(f"{type(err).__name__}: {' '.join(lines)}" if lines else type(err).__name__)


def _compact_parser_error(text: str) -> str:
    # jsonargparse reports a class's bad argument inside a list of Union alternatives; keep that alternative
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if line.startswith("- Problem with given class_path"):
            detail = [line[2:]]
            for following in lines[i + 1 :]:
                if following.startswith(("- ", "Given value")):
                    break
                detail.append(following)
            return " ".join([lines[0], *detail])
    return " ".join(lines)


def _clip(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def run_worker(
    command: Sequence[str],
    stdin_text: str,
    log_path: str,
    timeout_s: float | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    env: dict[str, str] | None = None,
) -> str | None:
    """Run one worker process to the end; ``None`` when it reported ``done``, else a one-line error.

    Its output (stdout and stderr) goes to ``log_path``; protocol lines are acted on. On timeout or when
    the caller is interrupted, the worker and its process group (DataLoader workers) are killed.
    """
    posix = os.name == "posix"
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            list(command),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            encoding="utf-8",
            errors="replace",
            env=env,
            start_new_session=posix,  # its own process group: a kill reaches its DataLoader workers too
        )
        lines: queue.Queue[str | None] = queue.Queue()
        reader = threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True)
        reader.start()
        try:
            assert proc.stdin is not None
            proc.stdin.write(stdin_text)
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass  # the worker died at start; its output and exit code say why
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        error: str | None = None
        done = timed_out = False
        last_output = ""
        last_progress: tuple[int, int] | None = None
        stragglers_killed = False
        try:
            while True:
                wait = POLL_S if deadline is None else min(POLL_S, max(0.0, deadline - time.monotonic()))
                try:
                    line = lines.get(timeout=wait)
                except queue.Empty:
                    if deadline is not None and time.monotonic() >= deadline:
                        timed_out = True
                        break
                    if proc.poll() is not None and not stragglers_killed:
                        # the worker is gone but a child of it still holds the pipe open: end it too
                        _kill(proc, posix)
                        stragglers_killed = True
                    continue
                if line is None:
                    break
                log.write(line)
                if not line.startswith(PROTOCOL_PREFIX):
                    last_output = line.strip() or last_output
                    continue
                kind, _, text = line[len(PROTOCOL_PREFIX) :].strip().partition(" ")
                if kind == "progress":
                    numbers = text.split()
                    if len(numbers) == 2 and all(n.isdigit() for n in numbers):
                        last_progress = (int(numbers[0]), int(numbers[1]))
                        if on_progress is not None:
                            on_progress(*last_progress)
                elif kind == "error":
                    error = text
                elif kind == "done":
                    done = True
        except BaseException:
            _kill(proc, posix)
            raise
        if timed_out:
            _kill(proc, posix)
        returncode = proc.wait()
        reader.join(KILL_WAIT_S)
    if timed_out:
        at = f" at step {last_progress[0]}/{last_progress[1]}" if last_progress else ""
        return f"timed out after {timeout_s:g} s{at}; the worker was stopped"
    if error:
        return error
    if returncode != 0:
        tail = f": {_clip(last_output)}" if last_output else ""
        return f"the worker exited with {_describe_returncode(returncode)}{tail}"
    if not done:
        return "the worker ended without reporting a result"
    return None


def _pump(stream: IO[str] | None, lines: queue.Queue[str | None]) -> None:
    try:
        if stream is not None:
            for line in stream:
                lines.put(line)
    finally:
        lines.put(None)


def _kill(proc: subprocess.Popen[str], posix: bool) -> None:
    try:
        if posix:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def _describe_returncode(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"


def worker_env() -> dict[str, str]:
    """The environment of a worker: the current directory first on PYTHONPATH, so config class paths import."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"  # the log keeps Lightning's and our lines in order
    return env
