"""PerfConfig: PerfCallback's arguments as one frozen, validated value.

PerfCallback keeps a flat, typed signature (the Lightning CLI configures every argument from YAML); it builds a
:class:`PerfConfig` once, and the rest of the package reads that instead of sixteen loose keywords.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from lightning_perf.analysis.numbers import is_number, whole
from lightning_perf.collect.schedule import ProfileSchedule

PROBE_MODES = ("auto", "always", "never")
ACTIVITY_NAMES = ("cpu", "cuda")


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

    def __post_init__(self) -> None:
        self.schedule  # noqa: B018 - builds and so validates the schedule numbers
        _set(self, "activities", validate_activities(self.activities))
        for name in ("max_trace_mb", "util_interval_s", "probe_budget_s"):
            _set(self, name, _positive(name, getattr(self, name)))
        _check_optional_count("batch_size", self.batch_size)
        _check_optional_count("log_every_n_steps", self.log_every_n_steps)
        value = self.log_min_interval_s
        if not is_number(value) or not (value >= 0):
            raise ValueError(f"`log_min_interval_s` must be a number >= 0, got {value!r}")
        _set(self, "log_min_interval_s", float(value))
        if self.probe_num_workers not in PROBE_MODES:
            raise ValueError(
                f"`probe_num_workers` must be one of {', '.join(map(repr, PROBE_MODES))}, "
                f"got {self.probe_num_workers!r}"
            )
        if self.dirpath is not None:
            if not isinstance(self.dirpath, (str, os.PathLike)):
                raise ValueError(f"`dirpath` must be a path or None, got {self.dirpath!r}")
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


def _set(config: PerfConfig, name: str, value: Any) -> None:
    object.__setattr__(config, name, value)  # normalising a frozen dataclass's own field in __post_init__


def _positive(name: str, value: Any) -> float:
    if not is_number(value) or not value > 0:
        raise ValueError(f"`{name}` must be a number > 0, got {value!r}")
    return float(value)


def _check_optional_count(name: str, value: Any) -> None:
    if value is None:
        return
    if whole(value) is None or value < 1:
        raise ValueError(f"`{name}` must be an integer >= 1 or None, got {value!r}")


def validate_activities(activities: Sequence[str] | None) -> tuple[str, ...] | None:
    """Check user-given activity names; ``None`` means "cpu, plus cuda when training on CUDA"."""
    if activities is None:
        return None
    if isinstance(activities, str):
        activities = [activities]
    names = []
    for name in activities:
        key = str(name).lower()
        if key not in ACTIVITY_NAMES:
            raise ValueError(f"`activities` entry {name!r} is not one of {list(ACTIVITY_NAMES)}")
        if key == "cuda" and not _cuda_available():
            raise ValueError("`activities` asks for 'cuda' but no CUDA device is available on this machine")
        if key not in names:
            names.append(key)
    if not names:
        raise ValueError(f"`activities` must name at least one of {list(ACTIVITY_NAMES)}, got an empty list")
    return tuple(names)


def _cuda_available() -> bool:
    import torch  # only when a user names "cuda": the config itself stays importable without torch

    return torch.cuda.is_available()
