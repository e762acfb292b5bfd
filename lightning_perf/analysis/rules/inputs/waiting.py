"""Diagnosis rules about the input pipeline: waiting for data, DataLoader settings, worker CPU.

Each rule is ``(summary, verdict) -> Finding | None``: silent when its evidence is absent.
"""

from __future__ import annotations

from typing import Protocol

from lightning_perf.analysis.gpu_measures import WITH_EPOCH_STARTS, input_wait
from lightning_perf.analysis.numbers import finite as _num
from lightning_perf.analysis.numbers import fmt1 as _fmt
from lightning_perf.analysis.rules.helpers import lightning_worker_bound, means, on_cuda, usable_cores
from lightning_perf.analysis.rules.inputs.loading import (
    WAITS,
    Loading,
    loading_of,
    machine_busy,
    suggest_workers,
)
from lightning_perf.analysis.rules.inputs.worker_model import handoff_of
from lightning_perf.analysis.rules.thresholds import (
    EPOCH_START_SHARE_PCT,
    INPUT_BOUND_HIGH_PCT,
    INPUT_BOUND_MODERATE_PCT,
    MIN_STEPS_FOR_VERDICT,
    VERDICTS,
    WORKER_SATURATED_PCT,
)
from lightning_perf.analysis.summary import Finding, RunSummary

# Fewer timed steps than this (and at least MIN_STEPS_FOR_VERDICT) give a hedged verdict: "may be ... (a short run)": worker start-up and the first prefetch
# burst (torch's DataLoader keeps prefetch_factor=2 batches per worker in flight) fill the first batches'
# wait; 20 steps are 10 such windows of 2, so start-up is at most a tenth of the share.
MIN_STEPS_FOR_INPUT_VERDICT = 20


TOO_SHORT_TITLE = "Too short for an input-bound verdict"


class _Graded(Protocol):
    """An input-bound finding as its readers see it: a summary's :class:`Finding` or the Perf tab's fast decode."""

    title: str
    verdict: str | None


def verdict_of(finding: _Graded) -> str:
    """The input-bound verdict as shown (one of ``VERDICTS``): the finding's ``verdict``; a finding without one
    shows its title (:data:`TOO_SHORT_TITLE`). Summaries written before the field named the grade only in the
    title: read there, in this one place, and only for them (a newer finding's title holds no grade then)."""
    if finding.verdict is not None:
        return finding.verdict
    return next((v for v in VERDICTS if v in finding.title), finding.title)


def too_short(summary: RunSummary) -> bool:
    """Fewer than :data:`MIN_STEPS_FOR_VERDICT` timed steps (0 means "not counted", as in old summaries), and no
    num_workers probe measured the DataLoader instead: no graded verdict then."""
    return 0 < summary.timing.steps < MIN_STEPS_FOR_VERDICT and summary.probes.num_workers is None


def _too_short_finding(summary: RunSummary, evidence: str) -> Finding:
    steps = summary.timing.steps
    timed = f"{steps} step was" if steps == 1 else f"{steps} steps were"
    return Finding(
        id="input_bound",
        severity="info",
        title=TOO_SHORT_TITLE,
        evidence=f"Only {timed} timed, fewer than the {MIN_STEPS_FOR_VERDICT} a verdict needs (status "
        f"{summary.status!r}); measured: {evidence}.",
        recommendation=f"Run at least {MIN_STEPS_FOR_VERDICT} training steps after the first (e.g. `max_steps` or "
        "`limit_train_batches`) for a verdict on the input pipeline.",
    )


def wait_share_grade(pct: float) -> str:
    """TensorFlow's grade (one of ``VERDICTS``) for a DataLoader wait share in percent."""
    if pct >= INPUT_BOUND_HIGH_PCT:
        return VERDICTS[0]
    if pct >= INPUT_BOUND_MODERATE_PCT:
        return VERDICTS[1]
    return VERDICTS[2]


def graded_words(summary: RunSummary, verdict: str) -> tuple[str, str]:
    """The verdict as worded for people, and the interval's part of the evidence.

    A share whose interval crosses a grade's line keeps the estimate's grade and says so ("moderately input-bound
    (its 95% interval crosses the 20.0% line)"): one verdict a card, never a title made of every grade, and the
    crossing says why a rerun may read the next grade.
    """
    timing = summary.timing
    low, high = _num(timing.data_wait_pct_low), _num(timing.data_wait_pct_high)
    if low is None or high is None:
        return verdict, ""
    interval = f", 95% interval {_fmt(low)}-{_fmt(high)}% from the per-step samples"
    # every grade from the interval's low end to its high end (VERDICTS run from highly to not)
    ends = [VERDICTS.index(g) for g in (wait_share_grade(low), wait_share_grade(high), verdict)]
    grades = list(reversed(VERDICTS[min(ends) : max(ends) + 1]))
    if len(grades) == 1:
        return verdict, interval
    lines = [line for line in (INPUT_BOUND_MODERATE_PCT, INPUT_BOUND_HIGH_PCT) if low < line <= high]
    crossing = " and ".join(f"{_fmt(line)}%" for line in lines) + " line" + ("s" if len(lines) > 1 else "")
    return f"{verdict} (its 95% interval crosses the {crossing})", interval + f", across the {crossing}"


def input_bound(summary: RunSummary, verdict: str | None) -> Finding | None:
    if verdict is None:
        return None
    wait = input_wait(summary)
    if wait.source == "host-side DataLoader wait":  # its interval comes from the host's per-step samples
        words, interval = graded_words(summary, verdict)
        evidence = f"DataLoader wait is {_fmt(wait.value)}% of step time{interval}" + means(summary)
    else:  # on a GPU: its own account, and which one
        words, interval = verdict, ""
        evidence = f"Input wait is {_fmt(wait.value)}% of step time ({wait.source})"
    if too_short(summary):
        return _too_short_finding(summary, evidence)
    if verdict == VERDICTS[2]:
        below = "" if "across the" in interval else f" (below the {_fmt(INPUT_BOUND_MODERATE_PCT)}% line)"
        return Finding(
            id="input_bound",
            severity="info",
            title=f"Training is {words}",
            evidence=evidence + f"{below}.",
            recommendation="The DataLoader keeps up; look at compute, not the input pipeline."
            if "crosses" not in words
            else "The DataLoader mostly keeps up; look at compute first, the input pipeline second.",
            verdict=verdict,
        )
    timing = summary.timing
    short = 0 < timing.steps < MIN_STEPS_FOR_INPUT_VERDICT
    if short and summary.probes.num_workers is None:  # a probe measured: its verdict stands
        return Finding(
            id="input_bound",
            severity="low",
            title=f"Training may be {words} (a short run)",
            evidence=evidence + f"; only {timing.steps} steps were timed, so start-up weighs on the share.",
            recommendation=f"Measure at least {MIN_STEPS_FOR_INPUT_VERDICT} steps before changing the input "
            "pipeline: a short run cannot tell a slow DataLoader from its start-up.",
            verdict=verdict,
        )
    severity = "high" if verdict == VERDICTS[0] else "medium"
    loading = loading_of(summary)
    if loading is not None:
        evidence += f"; {loading.describe()}"
    current = summary.settings.num_workers
    if wait.source.startswith(WITH_EPOCH_STARTS) and current and summary.settings.persistent_workers is False:
        # the starts make it input-bound: the workers restart every epoch, and keeping them alive is the fix
        return Finding(
            "input_bound",
            severity,
            f"Training is {words}",
            evidence + ".",
            f"Set `persistent_workers=True` in the training DataLoader: its {current} workers start again every "
            "epoch, and the batches wait for them.",
            {"persistent_workers": True},
            verdict,
        )
    recommendation, change = _workers_advice(summary, loading)
    return Finding(
        "input_bound", severity, f"Training is {words}", evidence + ".", recommendation, change, verdict
    )


def _workers_advice(summary: RunSummary, loading: Loading | None) -> tuple[str, dict[str, object]]:
    """The input-bound finding's recommendation and settings change for the DataLoader's workers."""
    current = summary.settings.num_workers
    advice = suggest_workers(summary)
    workers, why = advice.count, advice.why
    change: dict[str, object] = {} if workers is None else {"num_workers": workers}
    if workers is not None:
        recommendation = f"Set `num_workers={workers}` in the training DataLoader ({why})."
        more = workers > 0 and (current is None or workers > current)
        if more and loading is not None and loading.cause == WAITS:
            recommendation += (
                " Workers that wait cost little CPU; keep them alive across epochs (`persistent_workers=True`) "
                "and raise `prefetch_factor` if the wait stays uneven."
            )
        if (
            workers > 0
            and summary.settings.persistent_workers is not True
            and "persistent_workers=True" in recommendation
        ):
            change["persistent_workers"] = True  # the change does what the text says
    elif not advice.measured:
        recommendation = f"No workers count is advised ({why})."
    elif why and handoff_of(summary) is not None:
        recommendation = (
            f"Keep `num_workers={current}` ({why}); the wait is the loading itself: make the per-sample work "
            "cheaper or the batches larger."
        )
    elif why and loading is not None and loading.cause == WAITS:
        recommendation = (
            f"No more workers are advised ({why}): make the storage faster for this job (a local copy or cache "
            "of the data, fewer and larger reads, e.g. sharded archives) and raise `prefetch_factor`."
        )
    elif why:
        recommendation = (
            f"More workers will not help ({why}): make the per-sample work cheaper (decode, transforms, "
            "storage) or give the job more CPU cores."
        )
    else:
        recommendation = "Raise `num_workers` in the training DataLoader (current value and cores unknown)."
    return recommendation, change


def pin_memory(summary: RunSummary, verdict: str | None) -> Finding | None:
    settings = summary.settings
    if not on_cuda(summary) or settings.pin_memory is not False:
        return None
    if settings.loader_yields_cuda:  # batches are already on the GPU: there is no host copy to pin for
        return None
    # pageable host memory makes the host-to-device copy synchronous and slower; worth most when input-bound
    severity = "medium" if verdict in VERDICTS[:2] else "low"
    return Finding(
        id="pin_memory",
        severity=severity,
        title="pin_memory is off while training on CUDA",
        evidence=f"DataLoader pin_memory=False with accelerator={settings.accelerator!r}"
        + (f" and {verdict} (data wait {_fmt(summary.timing.data_wait_pct)}%)." if verdict else "."),
        recommendation="Set `pin_memory=True` so batches are copied to the GPU from page-locked memory.",
        settings_change={"pin_memory": True},
    )


def persistent_workers(summary: RunSummary, verdict: str | None) -> Finding | None:
    timing, settings = summary.timing, summary.settings
    if not settings.num_workers or settings.persistent_workers is not False:
        return None
    if verdict in VERDICTS[:2] and fewer_workers_advised(summary):
        return None
    start, step = timing.epoch_start_ms, timing.step_time_ms
    if start is None or step is None or timing.epochs <= 0 or timing.steps <= 0:
        return None
    # epoch time estimated as its steps at the mean step time (workers deliver in bursts: the median step of a
    # waiting loop can be a fraction of the mean) plus the start-up itself; its steps from the DataLoader's length
    # (Lightning's num_training_batches), not from a fit that max_steps cut short (a trial's 22 of 1,000)
    per_epoch = settings.train_batches_per_epoch or timing.steps / timing.epochs
    epoch_ms = per_epoch * step.mean + start.median
    share = 100.0 * start.median / epoch_ms if epoch_ms > 0 else None
    if share is None or share < EPOCH_START_SHARE_PCT:
        return None
    return Finding(
        id="persistent_workers",
        severity="medium",
        title="DataLoader workers restart every epoch",
        evidence=f"Epoch start-up (first fetch) takes {_fmt(start.median)} ms, {_fmt(share)}% of an epoch "
        f"(~{_fmt(epoch_ms)} ms: {_fmt(per_epoch)} steps at mean "
        f"{_fmt(step.mean)} ms), "
        f"with {settings.num_workers} workers and persistent_workers=False.",
        recommendation="Set `persistent_workers=True` so workers survive between epochs.",
        settings_change={"persistent_workers": True},
    )


def fewer_workers_advised(summary: RunSummary) -> bool:
    """The workers advice of this run is fewer workers than it has (the hand-off is the wait): then no finding
    may tune the workers it is told to drop."""
    current = summary.settings.num_workers
    if not current:
        return False
    workers = suggest_workers(summary).count
    return workers is not None and workers < current


def prefetch_factor(summary: RunSummary, verdict: str | None) -> Finding | None:
    workers = summary.settings.num_workers
    if verdict not in VERDICTS[:2] or not workers or fewer_workers_advised(summary):
        return None
    loading = loading_of(summary)
    if (
        loading is not None and loading.cause != WAITS
    ):  # workers that compute are short of cores, not of tasks
        return None
    current = summary.settings.prefetch_factor
    factor = current if current else 2  # torch's default when num_workers > 0
    return Finding(
        id="prefetch_factor",
        severity="low",
        title="Workers may not prefetch far enough ahead",
        evidence=f"Still {verdict} (data wait {_fmt(summary.timing.data_wait_pct)}%) with {workers} workers "
        f"and prefetch_factor={factor} ({workers * factor} batches in flight).",
        recommendation=f"Raise `prefetch_factor` to {factor * 2} to absorb uneven batch loading times.",
        settings_change={"prefetch_factor": factor * 2},
    )


def workers_exceed_cores(summary: RunSummary, verdict: str | None) -> Finding | None:
    workers, cores = summary.settings.num_workers, usable_cores(summary)
    if not workers or not cores:
        return None
    if verdict in VERDICTS[:2]:  # an input-bound run is never told to use fewer workers
        return None
    loading = loading_of(summary)
    if loading is not None and loading.cause == WAITS:  # workers that sleep do not compete for the cores
        return None
    local_ranks = max(summary.settings.devices or 1, 1)
    if workers * local_ranks <= cores:
        return None
    bound = lightning_worker_bound(cores, local_ranks)
    per_host = f"{workers} workers x {local_ranks} processes" if local_ranks > 1 else f"{workers} workers"
    return Finding(
        id="workers_exceed_cores",
        severity="medium",
        title="More DataLoader workers than CPU cores",
        evidence=f"{per_host} = {workers * local_ranks} worker processes on {cores} usable cores.",
        recommendation=f"Set `num_workers={bound}`: extra workers only compete for the same cores.",
        settings_change={"num_workers": bound},
    )


def workers_saturated(summary: RunSummary, verdict: str | None) -> Finding | None:
    cpu = summary.utilization.cpu
    busy = _num(cpu.workers_cpu_pct) if cpu else None
    workers = (cpu.num_workers_seen if cpu else None) or summary.settings.num_workers
    if busy is None or not workers:
        return None
    per_worker = busy / workers
    if per_worker < WORKER_SATURATED_PCT:
        return None
    # on a machine whose cores others hold, a CPU-bound verdict is withheld (rules_noise speaks first)
    bound = verdict in VERDICTS[:2] and machine_busy(summary) is None
    return Finding(
        id="workers_saturated",
        severity="medium" if bound else "low",
        title="The input pipeline is CPU-bound" if bound else "DataLoader workers are busy all the time",
        evidence=f"{workers} workers use {_fmt(busy)}% CPU together, {_fmt(per_worker)}% of a core each "
        f"(line {_fmt(WORKER_SATURATED_PCT)}%)" + (f", and training is {verdict}." if verdict else "."),
        recommendation="Make per-sample transforms cheaper (decode once, move augmentation to the GPU) "
        "or run on more CPU cores.",
    )
