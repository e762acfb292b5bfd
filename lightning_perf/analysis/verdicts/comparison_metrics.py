"""What ``compare`` puts side by side: the metrics (how each is read from a run summary, and the check that it
can be), the settings that differ, and labels for runs taken from those settings.

Pure; shared by the comparison, the HParams tab (``headline_metrics``) and run discovery (``check_summary``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lightning_perf.analysis.summary import (
    RunSummary,
    Settings,
    SummaryError,
    TimingSummary,
    UtilizationSummary,
)
from lightning_perf.analysis.verdicts.mean_intervals import mean_interval
from lightning_perf.analysis.verdicts.statistics import POINTS, RATE, RATIO, TIME

# Settings that describe the machine and software rather than a choice the user made: a difference here is
# flagged as a warning (the figures may reflect the machine, not the change), not listed as a setting change.
ENVIRONMENT_KEYS = ("host", "cpu_count", "gpu_name", "torch_version", "lightning_version", "cuda_version")


@dataclass(frozen=True)
class MetricSpec:
    key: str
    label: str
    unit: str
    better: str | None
    get: Callable[[RunSummary], float | None]
    # hidden when no run has a value (GPU figures on CPU-only runs)
    only_where_present: bool = False
    # the kind of change a test gives it (statistics.TIME, RATE, RATIO, POINTS): over the per-round values
    # under repeated rounds; None: descriptive only, never judged better or worse (the median, p90)
    tested: str | None = None
    # how single runs are tested from their per-step samples: "mean" (batch means of the step times),
    # "wait_share" (the DataLoader wait's share), "rate" (samples a step over the mean step); None: untested
    from_steps: str | None = None
    # the run's own 95% interval of the value, where the summary has one
    get_interval: Callable[[RunSummary], tuple[float | None, float | None]] | None = None


def _step_time(s: RunSummary, stat: str) -> float | None:
    dist = s.timing.step_time_ms
    return getattr(dist, stat) if dist is not None else None


def _median_interval(s: RunSummary) -> tuple[float | None, float | None]:
    dist = s.timing.step_time_ms
    return (dist.median_low, dist.median_high) if dist is not None else (None, None)


def _mean_interval(s: RunSummary) -> tuple[float | None, float | None]:
    interval = mean_interval(s.timing.step_samples_ms)
    return interval if interval is not None else (None, None)


def _wait_interval(s: RunSummary) -> tuple[float | None, float | None]:
    return s.timing.data_wait_pct_low, s.timing.data_wait_pct_high


def _gpu(s: RunSummary, name: str) -> float | None:
    gpu = s.utilization.gpu
    return getattr(gpu, name) if gpu is not None else None


def _cpu(s: RunSummary, name: str) -> float | None:
    cpu = s.utilization.cpu
    return getattr(cpu, name) if cpu is not None else None


METRICS: tuple[MetricSpec, ...] = (
    # the headline: what a user waits for is steps x the mean step (the median misleads on bursty loaders)
    MetricSpec(
        "step_time_mean_ms",
        "mean step time",
        "ms",
        "lower",
        lambda s: _step_time(s, "mean"),
        tested=TIME,
        from_steps="mean",
        get_interval=_mean_interval,
    ),
    # descriptive: shown with their own intervals, never judged
    MetricSpec(
        "step_time_median_ms",
        "median step time",
        "ms",
        "lower",
        lambda s: _step_time(s, "median"),
        get_interval=_median_interval,
    ),
    MetricSpec("step_time_p90_ms", "p90 step time", "ms", "lower", lambda s: _step_time(s, "p90")),
    MetricSpec(
        "data_wait_pct",
        "data wait",
        "%",
        "lower",
        lambda s: s.timing.data_wait_pct,
        tested=POINTS,
        from_steps="wait_share",
        get_interval=_wait_interval,
    ),
    MetricSpec(
        "samples_per_sec",
        "throughput",
        "samples/s",
        "higher",
        lambda s: s.timing.samples_per_sec,
        tested=RATE,
        from_steps="rate",
    ),
    MetricSpec("gpu_util_pct", "GPU util", "%", "higher", lambda s: _gpu(s, "util_pct"), True, POINTS),
    MetricSpec(
        "kernel_busy_pct", "kernel busy", "%", "higher", lambda s: _gpu(s, "kernel_busy_pct"), True, POINTS
    ),
    MetricSpec(
        "peak_gpu_mem_gb", "peak GPU memory", "GB", None, lambda s: _gpu(s, "peak_mem_used_gb"), True, RATIO
    ),
    MetricSpec(
        "process_cpu_pct", "process CPU", "%", None, lambda s: _cpu(s, "process_cpu_pct"), tested=POINTS
    ),
)
HEADLINE_KEY = "step_time_mean_ms"


def headline_metrics(summary: RunSummary) -> dict[str, float]:
    """The compared metrics of one run by key (absent ones left out): also what the HParams tab shows."""
    values = {spec.key: spec.get(summary) for spec in METRICS}
    return {key: float(value) for key, value in values.items() if value is not None}


# shown beside the headline in the verdict when both runs have them
VERDICT_DETAIL_KEYS = ("samples_per_sec", "data_wait_pct", "gpu_util_pct")


def check_summary(summary: RunSummary) -> None:
    """Raise :class:`SummaryError` saying what is wrong when a summary lacks the structure :func:`compare` reads.

    A hand-edited or corrupt ``perf_summary.json`` can parse yet hold ``"timing": null`` or a string where a
    number belongs; that must be an error, not a silent "n/a".
    """
    for name, kind in (
        ("timing", TimingSummary),
        ("utilization", UtilizationSummary),
        ("settings", Settings),
    ):
        if not isinstance(getattr(summary, name), kind):
            raise SummaryError(f"{name} is {getattr(summary, name)!r}, expected an object")
    steps = summary.timing.steps
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise SummaryError(f"timing.steps is {steps!r}, expected a whole number >= 0")
    for spec in METRICS:
        try:
            value = spec.get(summary)
        except AttributeError as err:
            raise SummaryError(f"cannot read {spec.key}: {err}") from err
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise SummaryError(f"{spec.key} is {value!r}, expected a number or null")


def settings_diffs(summaries: Sequence[RunSummary]) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
    """(settings, environment): key -> value per run, only the keys whose values differ between runs."""
    settings: dict[str, list[Any]] = {}
    environment: dict[str, list[Any]] = {}
    for f in dataclasses.fields(Settings):
        values = [getattr(s.settings, f.name) for s in summaries]
        if any(v != values[0] for v in values[1:]):
            (environment if f.name in ENVIRONMENT_KEYS else settings)[f.name] = values
    return settings, environment


def labels_from_settings(summaries: Sequence[RunSummary], names: Sequence[str]) -> list[str]:
    """A label per run from the settings that differ (``num_workers=4,pin_memory=True``); its name where none
    differ or two runs would get the same label."""
    differing, _ = settings_diffs(summaries)
    labels = [",".join(f"{key}={values[i]}" for key, values in differing.items()) for i in range(len(names))]
    if not differing or len(set(labels)) != len(labels):
        return list(names)
    return labels
