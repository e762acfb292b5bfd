"""Running one ``lightning-perf trial`` worker process: the line protocol, a time limit, a one-line error.

The worker (a round of the command, a config's too: :mod:`lightning_perf.trial.project.inject`) prints protocol
lines on stdout for the parent (``pace K N`` and ``progress K N``, ``disturbed TEXT``, ``done``, ``error
MESSAGE``); all its other output goes to a log file only.
The worker runs in its own process group with its DataLoader workers, and every way the parent leaves a round
ends that group: the round's end, its time limit, an exception, SIGINT, SIGTERM and SIGHUP (handlers installed
for the round, the previous ones restored after; SIGTERM and SIGHUP then end the parent with 128 + the signal:
:mod:`lightning_perf.trial.round_signals`).
Without ``--timeout-s`` a round is stopped at a limit derived from the measured pace (:class:`RoundLimits`).
Pure standard library: the parent never imports Lightning.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from lightning_perf.trial.round_signals import Terminated as Terminated  # what the CLI catches
from lightning_perf.trial.round_signals import group_ended_on_signals, kill_group

if TYPE_CHECKING:
    from lightning_perf.analysis.summary import RunSummary

# lines the worker prints for the parent start with this; everything else goes to the worker's log only
PROTOCOL_PREFIX = "@@lightning-perf-trial@@ "
# a failed variant's error is shown on one line, cut to this length (the full text is in the worker's log)
MAX_ERROR_CHARS = 400
# seconds to wait for a killed worker's output pipe to close, or for a worker that closed it to exit
KILL_WAIT_S = 10.0
# seconds between checks whether the worker has exited while its output pipe stays open (left-over children)
POLL_S = 0.5
# A round without --timeout-s stops at this multiple of the expected round time, and never before the floor:
# a round slowed tenfold by a busy machine (load 10-20 on 2 cores) still finishes, a hung one ends. Our choice.
ROUND_TIMEOUT_FACTOR = 10.0
ROUND_TIMEOUT_FLOOR_S = 120.0
# The limit while nothing is measured yet (the first round before its first step: imports, data set-up,
# compilation), finite so no round waits forever. Our choice, generous: --timeout-s sets another.
STARTUP_TIMEOUT_S = 1800.0
# the worker dies with the parent that started it (Linux): the parent's pid, checked by the worker
PARENT_ENV = "LIGHTNING_PERF_TRIAL_PARENT"


def protocol_line(kind: str, text: str = "") -> str:
    """A line the worker prints for the parent: ``progress K N``, ``error MESSAGE``, ``done``, ..."""
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


@dataclass
class RoundLimits:
    """What bounds the rounds of one trial (share one object between them). ``timeout_s`` (``--timeout-s``) wins when given. Else a round stops at :data:`ROUND_TIMEOUT_FACTOR` times
    its expected time, never before :data:`ROUND_TIMEOUT_FLOOR_S`: the expected time is the longer of the one
    known before (``expected_s``, e.g. tune's diagnosis fit, described by ``expected_from``; replaced by the
    first round that finishes) and the running round's own pace; :data:`STARTUP_TIMEOUT_S` while neither is
    known. ``budget_deadline`` (a ``time.monotonic()`` time, named by ``budget_label``) stops a running round and
    starts none after it. ``undecided`` (tune's): why another round could still decide the verdict, or None;
    asked after the planned rounds, more run up to ``max_rounds`` in all while the budget has time."""

    timeout_s: float | None = None
    expected_s: float | None = None
    expected_from: str = ""
    budget_deadline: float | None = None
    budget_label: str = "the budget"
    rounds_recorded: int = 0
    undecided: Callable[[list[Any]], str | None] | None = None
    max_rounds: int = 0

    def record(self, name: str, wall_s: float) -> None:
        """A round of ``name`` finished in ``wall_s`` seconds: the first one sets the expected round time."""
        if self.rounds_recorded == 0:
            self.expected_s, self.expected_from = wall_s, f"the first finished round, {name}"
        self.rounds_recorded += 1

    @property
    def exhausted(self) -> bool:
        """The budget is spent: no round should start."""
        return self.budget_deadline is not None and time.monotonic() >= self.budget_deadline

    def budget_note(self, rounds_done: int, rounds_planned: int) -> str:
        """The note of a trial the budget cut short."""
        return f"stopped at the budget ({self.budget_label}): {rounds_done} of {rounds_planned} rounds ran in full"

    def limit(self, own: tuple[float, str] | None = None) -> tuple[float, str]:
        """(seconds from a round's start, how they were set); ``own``: the running round's expected time and
        how it was measured (None before its first step)."""
        if self.timeout_s is not None:
            return self.timeout_s, f"--timeout-s {self.timeout_s:g}"
        known = [(self.expected_s, self.expected_from)] if self.expected_s is not None else []
        expected = max([*known, *([own] if own is not None else [])], default=None)
        if expected is None:
            return STARTUP_TIMEOUT_S, (
                f"no --timeout-s and no step measured yet: {STARTUP_TIMEOUT_S:g} s for the start-up"
            )
        factor, floor = ROUND_TIMEOUT_FACTOR, ROUND_TIMEOUT_FLOOR_S  # read now: tests may change them
        return max(floor, factor * expected[0]), (
            f"no --timeout-s: {factor:g}x the expected round time of {expected[0]:.1f} s ({expected[1]}), "
            f"at least {floor:g} s"
        )


@dataclass
class RoundReport:
    """What :func:`run_worker` saw of one round; pass one in to have it filled."""

    wall_s: float = 0.0
    limit_s: float | None = None  # the limit the round ran under at its end (seconds from its start), and how
    limit_why: str = ""
    stopped: str | None = None  # "timeout" or "budget" when the runner stopped the round
    progress: tuple[int, int] | None = None  # the last step reported, of how many
    disturbed: str | None = None  # what else used the machine, when it disturbed the round (see disturbance)


def own_pace(points: Sequence[tuple[float, int, int]]) -> tuple[float, str] | None:
    """A round's expected duration from its own reports, (seconds since its start, step K, of N): the time to
    the last step reported plus the steps left at the pace since the first (None before its first step)."""
    stepped = [p for p in points if p[1] >= 1]
    if not stepped:
        return None
    started = next((t for t, k, _ in points if k == 0), 0.0)  # training began: start-up before it
    (first, k1, _), (last, k, steps) = stepped[0], stepped[-1]
    per_step = (last - first) / (k - k1) if k > k1 else (first - started) / k1
    return last + max(steps - k, 0) * per_step, (
        f"this round's pace: {1000.0 * per_step:.0f} ms a step over {steps} steps after {started:.1f} s of "
        "start-up"
    )


def disturbance(summary: RunSummary) -> str | None:
    """What else used the machine while a round measured, when ``noisy_machine`` calls it disturbed (others on
    10% of the cores or more, steal, GPU clocks held down); None for a quiet or unrecorded machine."""
    from lightning_perf.analysis.rules.noise import noisy_machine

    machine = summary.machine
    if machine is None or noisy_machine(summary, None) is None:
        return None
    parts = []
    if machine.other_cores is not None and machine.cpu_count:
        share = 100.0 * machine.other_cores / machine.cpu_count
        parts.append(
            f"other processes used {machine.other_cores:.1f} of {machine.cpu_count} cores ({share:.0f}%)"
        )
    if machine.steal_pct:
        parts.append(f"steal {machine.steal_pct:.0f}%")
    if machine.load_avg_1m is not None:
        parts.append(f"load average {machine.load_avg_1m:.1f}")
    if machine.gpu_slowdown_pct:
        parts.append("the GPU's clocks held down")
    return ", ".join(parts) or "the machine was busy"


def run_worker(
    command: Sequence[str],
    stdin_text: str,
    log_path: str,
    timeout_s: float | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    env: dict[str, str] | None = None,
    limits: RoundLimits | None = None,
    report: RoundReport | None = None,
    on_limit: Callable[[float, str], None] | None = None,
) -> str | None:
    """Run one worker process to the end; ``None`` when it reported ``done``, else a one-line error.

    Its output (stdout and stderr) goes to ``log_path``; protocol lines are acted on. ``timeout_s`` (the user's)
    or ``limits`` (shared by a trial's rounds; a fresh one when None) bound the round; ``on_limit(seconds, why)``
    hears the limit whenever it changes; ``report`` is filled with what the round saw. However the round ends,
    the worker and its process group (DataLoader workers) are ended with it.
    """
    limits = limits if limits is not None else RoundLimits()
    if timeout_s is not None:
        limits = dataclasses.replace(limits, timeout_s=timeout_s)
    report = report if report is not None else RoundReport()
    if limits.exhausted:
        report.stopped = "budget"
        return f"not run: the budget ({limits.budget_label}) is spent"
    posix = os.name == "posix"
    env = {**(env if env is not None else os.environ), PARENT_ENV: str(os.getpid())}
    round_ = _Round(time.monotonic(), limits, report, on_progress, on_limit)
    with open(log_path, "w", encoding="utf-8") as log, group_ended_on_signals() as guard:
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
        guard.started(proc)  # a signal held while it started acts now
        lines: queue.Queue[str | None] = queue.Queue()
        reader = threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True)
        reader.start()
        try:
            assert proc.stdin is not None
            proc.stdin.write(stdin_text)
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass  # the worker died at start; its output and exit code say why
        try:
            round_.follow(proc, lines, log, posix)
        finally:
            kill_group(proc, posix)  # the round is over: whatever is left of its process group goes with it
        returncode = proc.wait()
        reader.join(KILL_WAIT_S)
    report.wall_s = time.monotonic() - round_.started
    error = round_.outcome(returncode)
    if error is None:
        run = os.path.normpath(os.path.abspath(log_path)).split(os.sep)[-3:-1]  # variant, round_N
        limits.record("/".join(run), report.wall_s)
    return error


@dataclass
class _Round:
    """One running round: its limits and report, and what its worker has said so far."""

    started: float
    limits: RoundLimits
    report: RoundReport
    on_progress: Callable[[int, int], None] | None
    on_limit: Callable[[float, str], None] | None
    error: str | None = None
    done: bool = False
    last_output: str = ""
    limit_s: float = STARTUP_TIMEOUT_S
    why: str = ""
    points: list[tuple[float, int, int]] = dataclasses.field(default_factory=list)

    def follow(
        self, proc: subprocess.Popen[str], lines: queue.Queue[str | None], log: IO[str], posix: bool
    ) -> None:
        """Read the worker's output into ``log`` until it closes or the round's limit passes."""
        self._update_limit(None)
        stragglers_killed = False
        while True:
            ends = min(self.started + self.limit_s, self.limits.budget_deadline or math.inf)
            try:
                line = lines.get(timeout=min(POLL_S, max(0.0, ends - time.monotonic())))
            except queue.Empty:
                if time.monotonic() >= ends:
                    self.report.stopped = "timeout" if self.started + self.limit_s <= ends else "budget"
                    return
                if _exited(proc) and not stragglers_killed:
                    # the worker is gone but a child of it still holds the pipe open: end it too
                    kill_group(proc, posix)
                    stragglers_killed = True
                continue
            if line is None:
                break
            log.write(line)
            if line.startswith(PROTOCOL_PREFIX):
                self._act_on(line[len(PROTOCOL_PREFIX) :])
            else:
                self.last_output = line.strip() or self.last_output
        _wait_exited(proc)  # its output is closed: it is ending, let it

    def _act_on(self, protocol: str) -> None:
        kind, _, text = protocol.strip().partition(" ")
        numbers = text.split()
        if kind in ("progress", "pace") and len(numbers) == 2 and all(n.isdigit() for n in numbers):
            done_steps, steps = int(numbers[0]), int(numbers[1])
            self.points.append((time.monotonic() - self.started, done_steps, steps))
            self.report.progress = max(self.report.progress or (0, steps), (done_steps, steps))
            if kind == "progress" and self.on_progress is not None:
                self.on_progress(done_steps, steps)
            self._update_limit(own_pace(self.points))
        elif kind == "disturbed":
            self.report.disturbed = text
        elif kind == "error":
            self.error = text
        elif kind == "done":
            self.done = True

    def _update_limit(self, own: tuple[float, str] | None) -> None:
        self.limit_s, self.why = self.limits.limit(own)
        if self.limit_s != self.report.limit_s and self.on_limit is not None:
            self.on_limit(self.limit_s, self.why)
        self.report.limit_s, self.report.limit_why = self.limit_s, self.why

    def outcome(self, returncode: int) -> str | None:
        """None for a round that reported ``done``, else its one-line error."""
        report, limits = self.report, self.limits
        at = f" at step {report.progress[0]}/{report.progress[1]}" if report.progress else ""
        if report.stopped == "budget":
            return f"stopped at the budget ({limits.budget_label}) after {report.wall_s:.0f} s{at}; the worker was stopped"
        if report.stopped == "timeout":
            if limits.timeout_s is not None:
                return f"timed out after {limits.timeout_s:g} s{at}; the worker was stopped"
            return f"timed out after {self.limit_s:.0f} s{at}; the worker was stopped ({self.why})"
        if self.error:
            return self.error
        if returncode != 0:
            tail = f": {_clip(self.last_output)}" if self.last_output else ""
            return f"the worker exited with {_describe_returncode(returncode)}{tail}"
        if not self.done:
            return "the worker ended without reporting a result"
        return None


def _pump(stream: IO[str] | None, lines: queue.Queue[str | None]) -> None:
    try:
        if stream is not None:
            for line in stream:
                lines.put(line)
    finally:
        lines.put(None)


def _exited(proc: subprocess.Popen[str]) -> bool:
    """Whether the worker has exited, without reaping it: its pid, the id of its process group, stays taken
    until the group is killed, so the kill cannot reach a process that reused the number."""
    if proc.returncode is not None:
        return True
    if not hasattr(os, "waitid"):
        return proc.poll() is not None
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _wait_exited(proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + KILL_WAIT_S
    while not _exited(proc) and time.monotonic() < deadline:
        time.sleep(0.02)


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
