"""The runs under TensorBoard's log dir and each run's Overview pane, from its ``perf_summary.json`` only (a few
KiB): what the tab paints first, whatever the size of the run's traces. Only the files :mod:`.safe_files` allows
are listed or read, and a file that cannot be decoded costs its own run's row, never the list."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import msgspec

from lightning_perf.analysis.compute.anatomy import PART_LABELS
from lightning_perf.analysis.compute.anatomy_text import top_hook
from lightning_perf.analysis.rules.cross_rank import find_straggler, rows_from_stats
from lightning_perf.analysis.rules.helpers import change_text
from lightning_perf.analysis.rules.inputs.waiting import verdict_of
from lightning_perf.analysis.run_discovery import find_runs
from lightning_perf.analysis.summary import (
    MAX_SUMMARY_BYTES,
    SCHEMA_NAME,
    SUMMARY_FILENAME,
    RunSummary,
    thinned,
)
from lightning_perf.analysis.verdicts.comparison import CompareError
from lightning_perf.analysis.verdicts.hparams_diff import difference_labels
from lightning_perf.output.hparams_experiment import VALUES_FILENAME, read_values
from lightning_perf.tensorboard_plugin.cache import cached, stamp
from lightning_perf.tensorboard_plugin.safe_files import UnknownRun, checked, is_inside, refusal
from lightning_perf.traces.report.build import TRACE_SUFFIXES, is_trace_file


def has_runs(logdir: str) -> bool:
    """Whether any run summary lies under ``logdir`` (the tab shows only then); stops at the first."""
    return bool(logdir) and any(SUMMARY_FILENAME in files for _, _, files in os.walk(logdir))


def run_dirs(logdir: str) -> dict[str, str]:
    """Run name -> run dir for every run under ``logdir``, named as TensorBoard names its runs (the path
    relative to the log dir, ``exp/version_0``), in ``lightning-perf compare``'s order."""
    try:
        found = find_runs([logdir])
    except CompareError:  # no run (yet): an empty list, the tab says so
        return {}
    root = os.path.abspath(logdir)
    named = {}
    for _, directory in found:
        # the walk follows no symlinked folder; this keeps out one swapped in since
        if not is_inside(directory, root):
            continue
        relative = os.path.relpath(os.path.abspath(directory), root).replace(os.sep, "/")
        named[os.path.basename(root) if relative == "." else relative] = directory
    return named


def run_dir(logdir: str, run: str) -> str:
    directory = run_dirs(logdir).get(run)
    if directory is None:
        raise UnknownRun(f"no run {run!r} under the log dir")
    return directory


def load(directory: str) -> RunSummary:
    """The run's summary, decoded once while its file is unchanged; :class:`UnknownRun` when the tab may not
    read it (a symlink out, a FIFO), :class:`SummaryError` when it is no summary."""
    path = checked(directory, SUMMARY_FILENAME)
    return cached.get(("summary", stamp(path)), lambda: RunSummary.load(path))


def verdict(summary: RunSummary | _Headline) -> dict[str, str] | None:
    """The input-bound verdict ("highly input-bound", ...) and its evidence; None when nothing was timed."""
    found = next((f for f in summary.findings if f.id == "input_bound"), None)
    if found is None:
        return None
    return {"verdict": verdict_of(found), "evidence": found.evidence}


# The run list's few figures, decoded by msgspec straight from the file (unknown fields skipped): a run's full
# typed decoding costs ~0.1 s, so a log root of a hundred runs would keep the tab blank for seconds.
class _Distribution(msgspec.Struct):
    mean: float


class _Timing(msgspec.Struct):
    steps: int = 0
    step_time_ms: _Distribution | None = None


class _Finding(msgspec.Struct):
    id: str
    title: str
    evidence: str = ""
    verdict: str | None = None  # absent in summaries written before Finding.verdict


class _Headline(msgspec.Struct):
    schema: str = ""
    status: str = ""
    world_size: int = 1
    timing: _Timing = msgspec.field(default_factory=_Timing)
    findings: list[_Finding] = []
    traces: list[dict[str, Any]] = []


def headline(directory: str) -> dict[str, Any]:
    """The picker's row of one run: status, steps, mean step, verdict; ``error`` when the file is no summary
    or one the tab may not read. Decoded once while the file is unchanged."""
    path = os.path.join(directory, SUMMARY_FILENAME)
    why = refusal(directory, path)
    if why is not None:
        return {"error": f"{path}: {why}"}
    try:
        return cached.get(("headline", stamp(path)), lambda: _headline(path))
    except OSError as err:  # removed since it was looked at
        return {"error": f"{path}: not a readable run summary: {err.strerror or err}"}


def _headline(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_SUMMARY_BYTES + 1)
        if len(raw) > MAX_SUMMARY_BYTES:
            return {"error": f"{path}: over {MAX_SUMMARY_BYTES >> 20} MiB, not a run summary"}
        found = msgspec.json.decode(raw, type=_Headline)
    except (OSError, msgspec.DecodeError) as err:  # ValidationError (a wrong type) is a DecodeError
        return {"error": f"{path}: not a readable run summary: {err}"}
    except RecursionError:  # msgspec's answer to `[[[...]]]`, however deep (1,000,000 tried, in a thread)
        return {"error": f"{path}: corrupt run summary: JSON nested too deeply"}
    if found.schema != SCHEMA_NAME:
        return {"error": f"{path}: not a lightning-perf run summary (no schema {SCHEMA_NAME!r})"}
    step = found.timing.step_time_ms
    return {
        "status": found.status,
        "steps": found.timing.steps,
        "world_size": found.world_size,
        "step_time_ms_mean": step.mean if step else None,
        "verdict": (verdict(found) or {}).get("verdict"),
        "traces": len(found.traces),
    }


def run_list(logdir: str) -> list[dict[str, Any]]:
    """One row a run for the picker: its name, what tells it apart from the other runs (``label``, from each
    run's HParams values), and headline figures, or why its summary cannot be read."""
    rows = []
    values = []
    for name, directory in run_dirs(logdir).items():
        rows.append({"name": name, **headline(directory)})
        values.append(_saved_values(directory))
    for row, label in zip(rows, difference_labels(values), strict=True):
        row["label"] = label
    return rows


def _saved_values(directory: str) -> dict[str, Any] | None:
    """The run's HParams values (``values`` of its saved file), None when absent, refused or unreadable."""
    path = os.path.join(directory, VALUES_FILENAME)
    if refusal(directory, path) is not None:
        return None
    try:
        saved = read_values(path)
    except RecursionError:  # read_values turns msgspec's DecodeError into None, not a nesting too deep
        return None
    return saved["values"] if saved else None


def overview(logdir: str, run: str) -> dict[str, Any]:
    """The Overview pane: verdict, findings, the per-step series, utilization, probes, ranks and files."""
    directory = run_dir(logdir, run)
    summary = load(directory)
    timing = summary.timing
    step_ms = thinned(timing.step_samples_ms)
    unsampled = dataclasses.replace(
        timing, step_samples_ms=[], wait_samples_ms=[]
    )  # asdict copies each sample
    return {
        "name": run,
        "run_dir": os.path.abspath(directory),
        "status": summary.status,
        "stage": summary.stage,
        "world_size": summary.world_size,
        "verdict": verdict(summary),
        "findings": [
            {**dataclasses.asdict(f), "change": change_text(f.settings_change).replace("`", "")}
            for f in summary.findings
        ],
        "timing": {k: v for k, v in dataclasses.asdict(unsampled).items() if not k.endswith("_samples_ms")},
        # per step in order (evenly thinned past MAX_SAMPLES): the step, its DataLoader wait, the rest computes.
        # Thinned again here as the writer thins them: a hand-made summary of a million samples (~6 CPU s to
        # send and draw) gets the same MAX_SAMPLES as any run.
        "series": {
            "step_ms": step_ms,
            "wait_ms": thinned(timing.wait_samples_ms),
            "every": _stride(timing.steps, len(step_ms)),
        },
        "slowdowns": [dataclasses.asdict(s) for s in summary.slowdowns],
        "memory": dataclasses.asdict(summary.memory) if summary.memory else None,
        "anatomy": anatomy(summary),
        "compute_limit": dataclasses.asdict(summary.compute_limit) if summary.compute_limit else None,
        "utilization": dataclasses.asdict(summary.utilization),
        "machine": dataclasses.asdict(summary.machine) if summary.machine else None,
        "settings": dataclasses.asdict(summary.settings),
        "num_workers_probe": dataclasses.asdict(probe) if (probe := summary.probes.num_workers) else None,
        "ranks": ranks_table(summary),
        "traces": traces(directory, summary),
        "files": files(directory),
    }


def traces(directory: str, summary: RunSummary) -> list[dict[str, Any]]:
    """The trace files in the run dir (by content, as ``lightning-perf report`` finds them), each with the
    steps the summary says it recorded."""
    steps = {os.path.basename(t.path): t.steps for t in summary.traces}
    return [
        {"file": f["file"], "bytes": f["bytes"], "steps": steps.get(f["file"], [])}
        for f in files(directory)
        if f["kind"] == "trace"
    ]


def anatomy(summary: RunSummary) -> dict[str, Any] | None:
    """Where the mean step goes (the hooks' self times): each part with its ms and share, then the callbacks
    and loggers the user chose, each with its costliest hook; None when the run has no anatomy."""
    found = summary.anatomy
    if found is None or found.step_ms <= 0:
        return None
    return {
        "steps": found.steps,  # the steps whose hooks were timed (one in sample_every past a fit's start)
        "sample_every": found.sample_every,
        "step_ms": found.step_ms,
        "parts": [
            {"part": part, "label": PART_LABELS.get(part, part), "ms": ms, "pct": found.share_pct(part)}
            for part, ms in found.parts_ms.items()
        ],
        "code": [
            {"name": top_hook(code), "kind": code.kind, "ms": code.ms_per_step}
            for code in sorted(found.callbacks + found.loggers, key=lambda code: -code.ms_per_step)
            if code.hooks_ms and code.kind != "lightning_perf"  # lightning-perf's own time is a part above
        ],
    }


def _stride(steps: int, samples: int) -> int:
    """How many steps one kept sample stands for (the summary thins evenly past its limit)."""
    return max(1, -(-steps // samples)) if samples else 1


def ranks_table(summary: RunSummary) -> dict[str, Any] | None:
    """The callback's per-rank table of a distributed run with its straggler (the rank the others wait for,
    found as the diagnosis finds it); None for one rank."""
    if len(summary.ranks) < 2:
        return None
    found = find_straggler(rows_from_stats(summary.ranks))
    return {
        "rows": [dataclasses.asdict(r) for r in summary.ranks],
        "straggler": dataclasses.asdict(found) if found else None,
    }


def files(directory: str) -> list[dict[str, Any]]:
    """The run's files the tab may serve (:func:`.safe_files.refusal`): the summary, diagnosis, traces (by
    content, as ``lightning-perf report`` finds them), TensorBoard events, exports."""
    listed = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if refusal(directory, path) is not None:  # before any open: a FIFO would hang, a symlink leak
            continue
        if name.endswith(TRACE_SUFFIXES) and is_trace_file(path):
            kind = "trace"
        elif name.startswith("events.out.tfevents"):
            kind = "TensorBoard events"
        elif "speedscope" in name:
            kind = "Speedscope"
        elif name.endswith((".json", ".md", ".yaml", ".txt", ".html", ".gz", ".png")):
            kind = "file"
        else:
            continue
        listed.append({"file": name, "kind": kind, "bytes": os.path.getsize(path)})
    return listed


def run_file(logdir: str, run: str, name: str) -> str:
    """The path of one of the run's listed files (a download): never a path outside the run dir, nor anything
    but a regular file."""
    directory = run_dir(logdir, run)
    path = checked(directory, name)  # first, to say why: a symlink out, a FIFO
    if name not in {f["file"] for f in files(directory)}:
        raise UnknownRun(f"no file {name!r} in run {run!r}")
    return path
