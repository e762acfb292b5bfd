"""PerfConfig: PerfCallback's arguments as one frozen, validated value.

PerfCallback keeps a flat, typed signature (the Lightning CLI configures every argument from YAML); it builds a
:class:`PerfConfig` once, and the rest of the package reads that instead of sixteen loose keywords.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal

from lightning_perf.collect.profiling import trace_ranks as trace_policy
from lightning_perf.collect.profiling.schedule import ProfileSchedule
from lightning_perf.errors import ConfigError, exit_if_cli

PROBE_MODES = ("auto", "always", "never")
if TYPE_CHECKING:  # what a type checker holds PerfCallback's arguments to
    ProbeMode = Literal["auto", "always", "never"]
    TraceRanks = Literal["auto", "all"] | list[int]
else:  # what jsonargparse (LightningCLI) reads: any string gets to __init__, whose one-line error names the
    # allowed values; a Literal would fail inside the Union of Trainer.callbacks, in a 70-line message
    ProbeMode = str
    TraceRanks = str | list[int]
ACTIVITY_NAMES = ("cpu", "cuda")
_BOOL_FIELDS = (
    "record_shapes",
    "profile_memory",
    "with_stack",
    "with_flops",
    "export_stacks",
    "export_speedscope",
    "export_memory_timeline",
    "enable_profiler",
    "utilization",
    "diagnose",
    "ab_cudnn_benchmark",
    "log_hparams",
    "profile_on_slowdown",
)
# Upper limits: far beyond any real use, and low enough that every later use of the number stays finite
# (max_trace_mb * 1e6 bytes as an int, a logging window of interval / step time batches, Event.wait()).
MAX_TRACE_MB = 1e9  # a petabyte of traces per run and rank
MAX_INTERVAL_S = 86400.0  # a day between logging windows or utilization samples
MAX_PROBE_BUDGET_S = 3600.0  # the num_workers probe runs after training: an hour is the most worth waiting
MAX_FLOPS_PER_BATCH = 1e30  # a million exaFLOPs a batch: beyond any model, and finite
# name: (whether 0 is allowed, upper bound, unit)
_NUMBER_RANGES = {
    "max_trace_mb": (False, MAX_TRACE_MB, "megabytes"),
    "log_min_interval_s": (True, MAX_INTERVAL_S, "seconds"),
    "util_interval_s": (False, MAX_INTERVAL_S, "seconds"),
    "probe_budget_s": (False, MAX_PROBE_BUDGET_S, "seconds"),
}


@dataclass(frozen=True)
class PerfConfig:
    """Every PerfCallback argument (see its docstring for what each means), checked once when built."""

    skip_first: int = 5
    wait: int = 1
    warmup: int = 1
    active: int = 3
    repeat: int = 1
    activities: tuple[str, ...] | None = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    dirpath: str | None = None
    max_trace_mb: float = 500.0
    export_stacks: bool = True
    export_speedscope: bool = False
    export_memory_timeline: bool = True
    enable_profiler: bool = True
    batch_size: int | None = None
    log_every_n_steps: int | None = None
    log_min_interval_s: float = 1.0
    utilization: bool = True
    util_interval_s: float = 0.1
    diagnose: bool = True
    probe_num_workers: Literal["auto", "always", "never"] = "auto"
    probe_budget_s: float = 10.0
    ab_cudnn_benchmark: bool = True
    log_hparams: bool = True
    trace_ranks: str | tuple[int, ...] = "auto"
    profile_on_slowdown: bool = True
    flops_per_batch: float | None = None

    def __post_init__(self) -> None:
        self.schedule  # noqa: B018 - builds and so validates the schedule numbers
        for name in _BOOL_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise _error(name, value, "True or False")
        _set(self, "activities", validate_activities(self.activities))
        _set(self, "trace_ranks", trace_policy.validate(self.trace_ranks))
        for name, (zero_ok, most, unit) in _NUMBER_RANGES.items():
            _set(self, name, _number(name, getattr(self, name), zero_ok, most, unit))
        for name in ("batch_size", "log_every_n_steps"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise _error(name, value, "an integer >= 1, or None")
        if self.flops_per_batch is not None:  # the user's figure replaces the counted one
            flops = _number("flops_per_batch", self.flops_per_batch, False, MAX_FLOPS_PER_BATCH, "FLOPs")
            _set(self, "flops_per_batch", flops)
        if not isinstance(self.probe_num_workers, str) or self.probe_num_workers not in PROBE_MODES:
            raise _error(
                "probe_num_workers", self.probe_num_workers, f"one of {', '.join(map(repr, PROBE_MODES))}"
            )
        if self.dirpath is not None:
            if not isinstance(self.dirpath, (str, os.PathLike)) or not os.fspath(self.dirpath):
                # "" would mean "no directory" to some calls and "the current one" to others
                raise _error("dirpath", self.dirpath, "a non-empty path, or None for the logger's log dir")
            _set(self, "dirpath", os.fspath(self.dirpath))

    @property
    def schedule(self) -> ProfileSchedule:
        return ProfileSchedule(
            skip_first=self.skip_first,
            wait=self.wait,
            warmup=self.warmup,
            active=self.active,
            repeat=self.repeat,
        )

    @property
    def max_trace_bytes(self) -> int:
        return int(self.max_trace_mb * 1e6)


def config_of(arguments: dict[str, Any]) -> PerfConfig:
    """PerfCallback's arguments (its ``locals()``, extra names ignored) as a :class:`PerfConfig`. A bad one
    raises :class:`ConfigError`; under a command line that builds the callback from YAML (LightningCLI) it ends
    the process instead, with one line naming the argument and what is allowed (:func:`exit_if_cli`)."""
    names = {f.name for f in fields(PerfConfig)}
    try:
        return PerfConfig(**{k: v for k, v in arguments.items() if k in names})
    except ConfigError as err:
        exit_if_cli(err, "PerfCallback")
        raise


def _set(config: PerfConfig, name: str, value: Any) -> None:
    object.__setattr__(config, name, value)  # normalising a frozen dataclass's own field in __post_init__


def _error(name: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"`{name}` must be {allowed}, got {value!r}")


def _number(name: str, value: Any, zero_ok: bool, most: float, unit: str) -> float:
    """A finite number in (0, ``most``], or [0, ``most``] when ``zero_ok``."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not (ok and (value >= 0 if zero_ok else value > 0) and value <= most):
        low = ">= 0" if zero_ok else "> 0"
        raise _error(name, value, f"a finite number of {unit} {low} and <= {most:g}")
    return float(value)


def validate_activities(activities: Sequence[str] | None) -> tuple[str, ...] | None:
    """Check user-given activity names; ``None`` means "cpu, plus cuda when training on CUDA"."""
    if activities is None:
        return None
    if isinstance(activities, str):
        activities = [activities]
    allowed = f"a list of {list(ACTIVITY_NAMES)} names, or None for cpu plus cuda when training on CUDA"
    if not isinstance(activities, (list, tuple)):
        raise _error("activities", activities, allowed)
    names = []
    for name in activities:
        key = name.lower() if isinstance(name, str) else None
        if key not in ACTIVITY_NAMES:
            raise ConfigError(f"`activities` entry {name!r} is not one of {list(ACTIVITY_NAMES)}")
        if key == "cuda" and not _cuda_available():
            raise ConfigError("`activities` asks for 'cuda' but no CUDA device is available on this machine")
        if key not in names:
            names.append(key)
    if not names:
        raise ConfigError(f"`activities` must name at least one of {list(ACTIVITY_NAMES)}, got an empty list")
    return tuple(names)


def _cuda_available() -> bool:
    import torch  # only when a user names "cuda": the config itself stays importable without torch

    return torch.cuda.is_available()
