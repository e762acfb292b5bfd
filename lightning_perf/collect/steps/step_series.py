"""StepSeries: every training step's figures against its global step, for the end-of-fit charts.

The logging windows give TensorBoard one point per ``log_every_n_steps`` batches: a 64-step run at Lightning's
default of 50 draws two points. At the end of a fit the whole run's series goes to the same tags
(:func:`lightning_perf.output.windows.write_step_series`): each window hands its steps here before the clock
resets it. Every step is kept up to ``2 * max_points`` steps; past that the kept ones are halved (every other
one) and the stride doubles, so memory and the per-window cost stay bounded however long the run, and the
series read back is evenly thinned to at most ``max_points``. No Lightning, no torch.

The windows' own points are part of the series, with the values they were logged with: TensorBoard's data
server (RustBoard, its default reader) drops a tag's points from a step on when an earlier step arrives after
them (a restarted job's), so the series is written whole, in step order, and a window's point is written again
as it was. A run that logged more windows than ``max_points`` gets no series: its windows draw its shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# TensorBoard keeps 1000 points of a scalar tag (its --samples_per_plugin default): more are never drawn, and
# each costs the end of the fit (~0.1 ms a point in TensorBoard's writer, the MFU series' as much again)
MAX_POINTS = 1000


@dataclass
class StepPoint:
    """The steps mapped to one global step: their mean step time and wait, and samples per step (-1: unknown);
    or, at a window's step, the values that window logged (``logged``)."""

    step: int
    step_ms: float = 0.0
    wait_ms: float = 0.0
    samples: float = -1.0
    logged: dict[str, float] | None = None


class StepSeries:
    def __init__(self, max_points: int = MAX_POINTS) -> None:
        self.max_points = max_points
        self.stride = 1  # every stride-th step is kept
        self._seen = 0  # steps handed in
        self._kept: list[tuple[int, float, float, int]] = []  # (global step, step ms, wait ms, samples)
        self._last_step = 0  # the global step the previous window ended at
        self.logged: (
            dict[int, dict[str, float]] | None
        ) = {}  # a window's step: its logged values; None: too many

    def add_window(
        self, step_ms: Sequence[float], wait_ms: Sequence[float], samples: Sequence[int], global_step: int
    ) -> None:
        """A window of closed steps ended at ``global_step``: its steps are spread evenly over the global steps
        since the previous window (under gradient accumulation several share one)."""
        count, start = len(step_ms), self._last_step
        span = max(0, global_step - start)
        first = (-self._seen) % self.stride  # kept steps are those whose run index is a multiple of stride
        for i in range(first, count, self.stride):
            step = start + -(-(i + 1) * span // count)  # the optimizer step the batch belongs to
            self._kept.append((step, step_ms[i], wait_ms[i], samples[i]))
        self._seen += count
        while len(self._kept) > 2 * self.max_points:
            self._kept = self._kept[::2]
            self.stride *= 2
        self._last_step = global_step

    def window_logged(self, global_step: int, values: dict[str, float]) -> None:
        """The values a window logged at ``global_step`` (the per-step tags only)."""
        if self.logged is not None:
            self.logged[global_step] = values
            if len(self.logged) > self.max_points:
                self.logged, self._kept = None, []  # the windows alone draw the run's shape

    def points(self) -> list[StepPoint]:
        """The run's series in step order: the windows' points as logged, and one point per other global step,
        evenly thinned so that there are at most ``max_points`` in all; none past ``max_points`` windows."""
        if self.logged is None:
            return []
        merged: dict[int, list[float]] = {}
        for step, step_ms, wait_ms, samples in self._kept:
            if step in self.logged:
                continue  # the window's own point is written as it was logged
            sums = merged.setdefault(step, [0.0, 0.0, 0.0, 0.0])
            sums[0] += 1
            sums[1] += step_ms
            sums[2] += wait_ms
            sums[3] = -1.0 if samples < 0 or sums[3] < 0 else sums[3] + samples
        steps = [
            StepPoint(step, s[1] / s[0], s[2] / s[0], s[3] / s[0] if s[3] >= 0 else -1.0)
            for step, s in sorted(merged.items())
        ]
        room = self.max_points - len(self.logged)
        if len(steps) > room:
            last = len(steps) - 1
            steps = [steps[round(i * last / (room - 1))] for i in range(room)] if room > 1 else steps[:room]
        windows = [StepPoint(step, logged=values) for step, values in self.logged.items()]
        return sorted(steps + windows, key=lambda point: point.step)
