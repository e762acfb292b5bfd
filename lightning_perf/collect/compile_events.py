"""Every ``torch.compile`` compilation during a fit: the batch it ran in, how long it took, why it recompiled.

Three things torch exposes (checked in 2.14's ``torch/_dynamo``) are read, nothing is patched:

* ``torch._dynamo.callback.callback_handler``: start/end callbacks around each compilation (dynamo's frame
  compile, and a lazily compiled backward). They run on the compiling thread, inside the step that compiles,
  so the step's index and the time are known exactly; the open step is then left out of the step statistics
  (:meth:`StepClock.drop_open`). Nothing runs on batches that compile nothing: no per-batch cost.
* ``torch._dynamo.utils.get_compilation_metrics()``: one record per compilation, with the guard failure that
  caused a recompile (``recompile_reason``, dynamo's own words) and failures such as the recompile limit (which
  gets no callback: dynamo gives up before compiling). Its deque keeps the last 64, so it is read at every
  compilation start, window and at the end.
* ``torch._dynamo.utils.counters``: graphs and graph breaks with their reasons, as differences over the fit.

Where the torch in use lacks one of them, one info line says what is not measured and the rest goes on.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from time import perf_counter
from typing import Any, Protocol

from lightning_perf import console
from lightning_perf.analysis import metrics
from lightning_perf.analysis.compile_summary import (
    MAX_COMPILE_EVENTS,
    MAX_REASON_CHARS,
    CompileEvent,
    CompileSummary,
)

log = console.logger(__name__)


class OpenStep(Protocol):
    """What a watch reads of the step clock (:class:`~lightning_perf.collect.steps.step_clock.StepClock`)."""

    @property
    def pause(self) -> str | None: ...

    def drop_open(self) -> bool: ...


class WatchedFit(Protocol):
    """What a watch reads of the fit it watches: ``collect.run_state.PerfSession`` is one. A protocol, not an
    import: run_state makes the watch, so importing it back would be a cycle (tests/test_architecture.py)."""

    @property
    def batches(self) -> int: ...

    @property
    def clock(self) -> OpenStep: ...


COMPILE_TIME_S = metrics.COMPILE_TIME.tag
RECOMPILES = metrics.RECOMPILES.tag
# what is not measured, said once per process
_told: set[str] = set()
# packages whose code is Lightning's own: Lightning < 2.5 lets dynamo trace self.log into the compiled step
_LIGHTNING_PACKAGES = (
    "lightning",
    "pytorch_lightning",
    "lightning_fabric",
    "lightning_utilities",
    "torchmetrics",
)


def in_lightning(filename: str | None) -> bool:
    """Whether a code object's file lies in one of Lightning's packages."""
    parts = str(filename or "").replace("\\", "/").split("/")
    return any(package in parts[:-1] for package in _LIGHTNING_PACKAGES)


def resume_files() -> dict[str, str]:
    """Where each resume function dynamo made after a graph break lives (its name -> the file of the code that
    broke), read from dynamo's cache of them; empty where this torch keeps it elsewhere."""
    try:
        from torch._dynamo.resume_execution import ContinueExecutionCache

        generated = ContinueExecutionCache.cache.values.values()
        return {code.co_name: code.co_filename for codes in generated for code in codes.values()}
    except Exception:
        return {}


def _tell_once(what: str) -> None:
    if what not in _told:
        _told.add(what)
        import torch

        log.info(f"lightning-perf: torch {torch.__version__} has no {what}; it is not measured")


def short_reason(text: Any) -> str:
    """A reason as one would read it: dynamo's first lines (the guard, or the break and its explanation), without
    the hints, stack traces and links that follow, at most MAX_REASON_CHARS."""
    lines = []
    for line in str(text).strip().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith(("Hint:", "User stack trace", "Developer debug", "For more")):
            break
        lines.append(stripped)
    joined = " ".join(lines) or str(text).strip()
    return joined[:MAX_REASON_CHARS]


class CompileWatch:
    """The compilations of one fit; made by :func:`watch`, ended by :meth:`finish`."""

    def __init__(self, session: WatchedFit, handler: Any, records: Any, counters: Any) -> None:
        self._session = session
        self._handler = handler
        self._records = records  # get_compilation_metrics, or None
        self._counters = counters  # dynamo's counters, or None
        self._seen = {self._key(r) for r in self._read_records()}
        self._baseline = self._counts()
        self._events: dict[str, CompileEvent] = {}
        self._open: tuple[float, str, int, str, bool] | None = None
        self.summary = CompileSummary()
        self._window_s = 0.0
        self._window_recompiles = 0
        self._finished = False
        if records is None:
            self.summary.unmeasured.append("recompile reasons")
        if counters is None:
            self.summary.unmeasured.append("graphs and graph breaks")
        handler.register_start_callback(self._started)
        handler.register_end_callback(self._ended)

    # -- dynamo's callbacks: on the compiling thread, once per compilation ------------------------------

    def _started(self, args: Any = None) -> None:
        if self._finished:
            return
        try:
            self._harvest()
            session = self._session
            pause = session.clock.pause
            dropped = session.clock.drop_open() if pause is None else False
            compile_id = str(getattr(args, "compile_id", "") or f"#{len(self._events)}")
            step = max(0, session.batches - 1)
            self._open = (perf_counter(), compile_id, step, pause or "train", dropped)
        except Exception as err:  # never in the way of the compilation
            log.debug(f"lightning-perf: compile start not recorded: {err}")

    def _ended(self, args: Any = None) -> None:
        opened, self._open = self._open, None
        if opened is None or self._finished:
            return
        try:
            self._record(opened, perf_counter() - opened[0])
        except Exception as err:  # dynamo runs this in a finally: raising here would fail the compilation
            log.debug(f"lightning-perf: compile end not recorded: {err}")

    def _record(self, opened: tuple[float, str, int, str, bool], seconds: float) -> None:
        _, compile_id, step, stage, dropped = opened
        event = self._events.get(compile_id)
        if event is None:
            event = self._add(CompileEvent(compile_id, step, stage))
        event.duration_s += seconds
        event.step_excluded = event.step_excluded or dropped
        self.summary.steps_excluded += int(dropped)
        self._window_s += seconds

    # -- windows and the end ----------------------------------------------------------------------------

    def take_window(self) -> dict[str, float]:
        """Compile seconds and recompiles since the last window; nothing before the first compilation."""
        try:
            self._harvest()
        except Exception as err:  # on the training thread, between steps: never in training's way
            log.debug(f"lightning-perf: compilation records not read: {err}")
        if not self._events:
            return {}
        figures = {COMPILE_TIME_S: self._window_s, RECOMPILES: float(self._window_recompiles)}
        self._window_s, self._window_recompiles = 0.0, 0
        return figures

    def finish(self) -> CompileSummary | None:
        """Stop watching; the fit's compilations, or None when nothing compiled. Never raises."""
        if self._finished:
            return None
        self._finished = True
        for remove, callback in (
            (getattr(self._handler, "remove_start_callback", None), self._started),
            (getattr(self._handler, "remove_end_callback", None), self._ended),
        ):
            if remove is not None:
                with contextlib.suppress(Exception):  # already gone (torch._dynamo.callback_handler.clear())
                    remove(callback)
        try:
            return self._summarise()
        except Exception as err:
            log.warning(f"lightning-perf: could not summarise torch.compile's compilations: {err}")
            return None

    def _summarise(self) -> CompileSummary | None:
        self._harvest()
        summary = self.summary
        graphs, breaks, sites = self._counts()
        if self._counters is not None:
            base_graphs, base_breaks, base_sites = self._baseline
            # torch._dynamo.reset() during the fit clears the counters: then what is there is all since
            summary.graphs = graphs - base_graphs if graphs >= base_graphs else graphs
            grown = breaks - base_breaks if sum(breaks.values()) >= sum(base_breaks.values()) else breaks
            summary.graph_breaks = sum(grown.values())
            reasons: Counter[str] = Counter()
            for reason, count in grown.items():
                reasons[short_reason(reason)] += count
            summary.break_reasons = dict(reasons.most_common())
            summary.break_sites = dict((sites - base_sites).most_common())
            files = resume_files()
            summary.lightning_sites = [site for site in summary.break_sites if in_lightning(files.get(site))]
        if not self._events and not summary.graph_breaks:
            return None
        compiled = [e for e in self._events.values() if e.failure is None]
        durations = [e.duration_s for e in compiled]
        summary.compiles = len(compiled)
        summary.total_s = sum(durations)
        summary.longest_s = max(durations, default=0.0)
        summary.recompiles = sum(1 for e in compiled if e.recompile_reason is not None)
        summary.events = list(self._events.values())[:MAX_COMPILE_EVENTS]
        log.info(describe(summary))
        return summary

    # -- reading torch's records and counters -----------------------------------------------------------

    def _add(self, event: CompileEvent) -> CompileEvent:
        self._events[event.compile_id] = event
        return event

    def _read_records(self) -> list[Any]:
        if self._records is None:
            return []
        try:
            return list(self._records())
        except Exception:
            return []

    @staticmethod
    def _key(record: Any) -> tuple[Any, Any, Any]:
        return (getattr(record, "compile_id", None), getattr(record, "start_time_us", None), id(record))

    def _harvest(self) -> None:
        """Join dynamo's records of finished compilations to the events the callbacks made."""
        for record in self._read_records():
            key = self._key(record)
            if key in self._seen:
                continue
            self._seen.add(key)
            compile_id = str(getattr(record, "compile_id", "") or "")
            event = self._events.get(compile_id)
            if event is None:  # no callback ran: dynamo gave up before compiling (e.g. the recompile limit)
                session = self._session
                step, pause = max(0, session.batches - 1), session.clock.pause
                event = self._add(CompileEvent(compile_id, step, pause or "train"))
            fail = getattr(record, "fail_reason", None)
            if fail and event.failure is None and not event.duration_s:
                event.failure = short_reason(fail)  # nothing was compiled
                if "recompile" in fail.lower() and "limit" in fail.lower():
                    self.summary.recompile_limit_hit = True
            reason = getattr(record, "recompile_reason", None)
            if reason and event.recompile_reason is None:
                event.recompile_reason = short_reason(reason)
                self._window_recompiles += int(event.failure is None)
            event.function = event.function or getattr(record, "co_name", None)
            event.in_lightning = event.in_lightning or in_lightning(getattr(record, "co_filename", None))

    def _counts(self) -> tuple[int, Counter[str], Counter[str]]:
        counters = self._counters
        if counters is None:
            return 0, Counter(), Counter()
        try:
            graphs = int(counters["stats"].get("unique_graphs", 0))
            return graphs, Counter(dict(counters["graph_break"])), Counter(dict(counters["resumes"]))
        except Exception:
            return 0, Counter(), Counter()


def describe(summary: CompileSummary) -> str:
    """The console line at the end of a compiled fit: compile work kept apart from the step statistics."""
    line = (
        f"lightning-perf: torch.compile: {summary.compiles} compilation(s), {summary.recompiles} recompile(s), "
        f"{summary.total_s:.2f} s in all (longest {summary.longest_s:.2f} s)"
    )
    if summary.graph_breaks:
        line += f"; {summary.graph_breaks} graph break(s) over {summary.graphs} graph(s)"
    if summary.steps_excluded:
        line += f"; {summary.steps_excluded} step(s) that compiled are left out of the step statistics"
    return line


def watch(session: WatchedFit) -> CompileWatch | None:
    """Watch the fit of ``session``; None (and one info line) when this torch has no compile callbacks."""
    try:
        from torch._dynamo.callback import callback_handler

        handler = callback_handler
        handler.register_start_callback  # noqa: B018  (callbacks of older torch take no arguments: both work)
        handler.register_end_callback  # noqa: B018
    except Exception:
        _tell_once("compile callbacks (torch._dynamo.callback.callback_handler): torch.compile")
        return None
    try:
        from torch._dynamo.utils import get_compilation_metrics
    except Exception:
        _tell_once("compilation metrics (torch._dynamo.utils.get_compilation_metrics): recompile reasons")
        get_compilation_metrics = None  # type: ignore[assignment]
    try:
        from torch._dynamo.utils import counters
    except Exception:
        _tell_once("dynamo counters (torch._dynamo.utils.counters): graph breaks")
        counters = None  # type: ignore[assignment]
    try:
        return CompileWatch(session, handler, get_compilation_metrics, counters)
    except Exception as err:
        log.info(f"lightning-perf: torch.compile is not measured: {err}")
        return None
