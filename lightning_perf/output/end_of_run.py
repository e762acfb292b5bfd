"""The writers of a run's end: its summary file, the diagnosis (Text tab, console, perf_diagnosis.md), the trace
chart, HParams, the other loggers, and the last line naming the run's folder. They write what
:func:`lightning_perf.run_end.pipeline.finish_run` measured, probed and diagnosed; none raises.
"""

from __future__ import annotations

import os
import queue
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from lightning_perf import console
from lightning_perf.analysis import metrics
from lightning_perf.analysis.summary import SUMMARY_FILENAME, RunSummary
from lightning_perf.atomic_file import atomic_open, describe_os_error
from lightning_perf.collect.profiling.schedule import ProfileSchedule
from lightning_perf.collect.run_state import PerfSession
from lightning_perf.output import loggers as tensorboard
from lightning_perf.output import trace_findings
from lightning_perf.output.other_loggers import DIAGNOSIS_FILE

if TYPE_CHECKING:
    from lightning_perf.collect.config import PerfConfig

log = console.logger(__name__)


def write(
    trainer: Any, summary: RunSummary, config: PerfConfig, *, log_dir: str | None, hp_placeholder: bool
) -> None:
    """perf_summary.json, and for a fit: the diagnosis (Text tab, console, perf_diagnosis.md), the trace chart,
    HParams. Never raises."""
    summary_path = save(summary, log_dir)
    if summary.stage != "fit":
        return
    markdown = _show_findings(trainer, summary, no_trace_hint(summary, config))
    if markdown is not None and log_dir:
        path = os.path.join(log_dir, DIAGNOSIS_FILE)
        safely(f"write {path}", lambda: _write_text(path, markdown))
    safely("draw the trace chart", lambda: trace_findings.log_chart(trainer, summary))
    if config.log_hparams:
        safely("write the HParams", lambda: tensorboard.write_hparams(trainer, summary, hp_placeholder))
    # CSV, MLflow, W&B, ...: the same results through each logger's own API
    safely(
        "publish to the other loggers",
        lambda: tensorboard.publish_run_end(trainer, summary, markdown, summary_path),
    )


def _write_text(path: str, text: str) -> None:
    with atomic_open(path) as handle:
        handle.write(text)


def save(summary: RunSummary, log_dir: str | None) -> str | None:
    """Write the summary file; its path, or None when there is none (no log dir, or the disk said no)."""
    if not log_dir:
        return None
    name = SUMMARY_FILENAME if summary.stage == "fit" else f"perf_summary_{summary.stage}.json"
    path = os.path.join(log_dir, name)
    # a failed write leaves any older file in place: only a path written now is handed on
    return path if safely(f"write {path}", lambda: summary.save(path)) else None


def _show_findings(trainer: Any, summary: RunSummary, no_trace: str | None) -> str | None:
    """The diagnosis in the Text tab and on the console; its Markdown (None without findings or on an error)."""
    if not summary.findings:
        return None
    shown: list[str] = []
    safely("show the diagnosis", lambda: shown.append(_render_findings(trainer, summary, no_trace)))
    return shown[0] if shown else None


def _render_findings(trainer: Any, summary: RunSummary, no_trace: str | None) -> str:
    from lightning_perf.analysis.findings_render import answer_markdown, render_answer

    markdown = answer_markdown(summary.findings, summary, no_trace)
    tensorboard.add_text(trainer, metrics.DIAGNOSIS_TEXT.tag, markdown, trainer.global_step)
    log.info(render_answer(summary.findings, summary, no_trace))
    return markdown


def no_trace_hint(summary: RunSummary, config: PerfConfig) -> str | None:
    """Why the run has no trace to show operators from, and how to get one; None when it has one."""
    if summary.trace_figures:
        return None
    if not config.enable_profiler:
        return "no trace recorded: the profiler is off (enable_profiler=False)"
    if summary.traces:
        return "no trace could be read (see the warning above); `lightning-perf report` names the error"
    schedule = config.schedule
    first = schedule.skip_first + schedule.cycle_length
    return (
        f"no trace recorded: run longer than {first} steps or set a shorter profiling schedule "
        f"(now {schedule.describe()}: the first trace is written after batch {first})"
    )


def where_line(summary: RunSummary, log_dir: str | None) -> str | None:
    """The last line of a fit: its folder, the files in it, and the commands that open them."""
    if not log_dir or not os.path.isdir(log_dir):
        return None
    names = [n for n in (SUMMARY_FILENAME, DIAGNOSIS_FILE) if os.path.isfile(os.path.join(log_dir, n))]
    traces = [t.path for t in summary.traces]
    if traces or len(summary.trace_ranks) > 1:
        names.append(traces_phrase(traces, summary.trace_ranks, summary.global_rank))
    folder = shlex.quote(log_dir)
    events = any(n.startswith("events.out.tfevents") for n in os.listdir(log_dir))
    commands = ([f"`tensorboard --logdir {folder}`"] if events or traces else []) + [
        f"`lightning-perf report {folder}`"
    ]
    files = ", ".join(names) if names else "no file (see the warnings above)"
    return f"lightning-perf: run folder {log_dir}: {files}; open with {' or '.join(commands)}"


def traces_phrase(traces: list[str], trace_ranks: list[int], rank: int) -> str:
    """This rank's traces, and in a multi-rank job the ranks whose traces sit beside them (each rank writes its
    own, possibly after this line is printed)."""
    listed = f"{', '.join(traces[:2])}{', ...' if len(traces) > 2 else ''}"
    count = f"{len(traces)} trace{'s' if len(traces) != 1 else ''}"
    if len(trace_ranks) <= 1:
        return f"{count} ({listed})"
    ranks = ", ".join(map(str, trace_ranks[:8])) + (", ..." if len(trace_ranks) > 8 else "")
    if not traces:
        return f"the traces of ranks {ranks} (rank {rank} records none)"
    return f"{count} from each of ranks {ranks} (rank {rank}'s: {listed})"


def safely(what: str, job: Any) -> bool:
    """Run ``job``; on an error one warning names what was lost and why. True when it ran through."""
    try:
        job()
    except Exception as err:  # the run's own outcome wins
        reason = describe_os_error(err) if isinstance(err, OSError) else err
        log.warning(f"lightning-perf: could not {what}: {reason}")
        return False
    return True


def short_run_message(schedule: ProfileSchedule, session: PerfSession) -> str | None:
    """One info line when the run ended before the schedule did; None otherwise."""
    last_step = schedule.last_step
    if session.window is None or last_step is None or session.batches > last_step:
        return None
    written = len(session.window.traces)
    outcome = f"{written} trace(s) written." if written else "no step was recorded, so no trace was written."
    return (
        f"lightning-perf: the {session.stage} run ended after {session.batches} batches, shorter than the "
        f"profiling schedule ({schedule.describe()}: {last_step + 1} batches); {outcome}"
    )


@contextmanager
def bulk_writes(trainer: Any) -> Iterator[None]:
    """The end of a fit's thousand-point series, written to TensorBoard without waiting at every tenth.

    TensorBoard's writer hands each event to its own thread through a queue of ``max_queue`` (10 by default) and
    the training thread waits whenever it is full: thousands of points written at once wait hundreds of times,
    each a trip through the OS scheduler (seconds on a loaded machine). Inside this block the queue takes them
    all, and the flush after waits once for the writer to drain it. Nothing changes where the writer is not the
    one this knows (its queue is left as it is)."""
    found = _event_queue(trainer)
    if found is None:
        yield
        return
    bound, found.maxsize = found.maxsize, 0
    try:
        yield
    finally:
        found.maxsize = bound


def _event_queue(trainer: Any) -> queue.Queue | None:
    """The queue of the TensorBoard run's event writer thread (tensorboard's EventFileWriter), or None."""
    logger = tensorboard.tensorboard_logger(trainer)
    if logger is None or not trainer.is_global_zero:
        return None
    try:
        writer = logger.experiment._get_file_writer()
        found = writer.event_writer._async_writer._byte_queue
    except Exception:  # another writer, or another tensorboard: its queue as it is
        return None
    return found if isinstance(found, queue.Queue) else None


def log_where(summary: RunSummary, log_dir: str | None) -> None:
    line = where_line(summary, log_dir)
    if line:
        log.info(line)
