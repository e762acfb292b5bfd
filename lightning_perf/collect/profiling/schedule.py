"""The profiling schedule: which batch is skipped, waited, warmed up or recorded.

The policy is one small pure function, :meth:`ProfileSchedule.action`, with exactly the semantics of
``torch.profiler.schedule(skip_first=..., wait=..., warmup=..., active=..., repeat=...)``; the tests compare
the two step by step. Unlike a torch schedule function it is a frozen dataclass: it validates its numbers,
pickles (``ddp_spawn``), and can say cheaply when the next cycle starts, so no profiler needs to exist
(or be stepped) between cycles.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from torch.profiler import ProfilerAction

from lightning_perf.errors import ConfigError

_SCHEDULE_FIELDS = ("skip_first", "wait", "warmup", "active", "repeat")
_MEANING = {"active": " (batches recorded per cycle)", "repeat": " (0 repeats until training ends)"}


@dataclass(frozen=True)
class ProfileSchedule:
    """Profile ``active`` batches after ``wait`` idle and ``warmup`` warm-up batches, ``repeat`` times.

    Args:
        skip_first: batches ignored before the first cycle starts.
        wait: idle batches at the start of each cycle.
        warmup: batches the profiler runs but discards (its start-up cost lands here, not in the trace).
        active: batches recorded per cycle; each cycle writes one trace.
        repeat: number of cycles; ``0`` repeats until training ends.
    """

    skip_first: int = 5
    wait: int = 1
    warmup: int = 1
    active: int = 3
    repeat: int = 1

    def __post_init__(self) -> None:
        for name in _SCHEDULE_FIELDS:
            value = getattr(self, name)
            least = 1 if name == "active" else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                meaning = _MEANING.get(name, "")
                raise ConfigError(f"`{name}` must be an integer >= {least}{meaning}, got {value!r}")
        if self.warmup == 0:
            # Same advice torch.profiler.schedule gives: the first recorded step then pays the start-up cost.
            warnings.warn(
                "`warmup=0`: the profiler's start-up cost will land in the first recorded step",
                stacklevel=3,
            )

    @property
    def cycle_length(self) -> int:
        return self.wait + self.warmup + self.active

    def action(self, step: int) -> ProfilerAction:
        """The profiler action for batch ``step`` (0-based, counted over the whole run)."""
        if step < self.skip_first:
            return ProfilerAction.NONE
        offset = step - self.skip_first
        if self.repeat > 0 and offset >= self.repeat * self.cycle_length:
            return ProfilerAction.NONE
        position = offset % self.cycle_length
        if position < self.wait:
            return ProfilerAction.NONE
        if position < self.wait + self.warmup:
            return ProfilerAction.WARMUP
        if position < self.cycle_length - 1:
            return ProfilerAction.RECORD
        return ProfilerAction.RECORD_AND_SAVE

    def next_cycle_start(self, step: int) -> int | None:
        """The first batch ``>= step`` on which the profiler must exist; ``None`` when no cycle is left."""
        if step < self.skip_first:
            step = self.skip_first
        offset = step - self.skip_first
        if self.repeat > 0 and offset >= self.repeat * self.cycle_length:
            return None
        position = offset % self.cycle_length
        if position < self.wait:
            return step + (self.wait - position)
        return step

    @property
    def last_step(self) -> int | None:
        """The last batch of the last cycle, or ``None`` when cycles repeat forever."""
        if self.repeat == 0:
            return None
        return self.skip_first + self.repeat * self.cycle_length - 1

    def describe(self) -> str:
        return ", ".join(f"{name}={getattr(self, name)}" for name in _SCHEDULE_FIELDS)
