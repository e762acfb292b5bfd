"""Bounded memory for a run's per-step times: every step exactly up to a bound, a quantile sketch past it.

:class:`~lightning_perf.collect.steps.step_clock.StepClock` keeps each step's time, DataLoader wait and batch size in
arrays (24 bytes a step). A run of ten million steps would hold 240 MB, so once the arrays pass
:data:`EXACT_STEPS`, the next logging window folds them into :class:`FoldedSteps`: exact sums, counts, minimum
and maximum, a DDSketch (the ``ddsketch`` library: mergeable, relative-error quantiles) of step time, wait and
compute, and an evenly spaced sample of at most ``2 * MAX_SAMPLES`` steps over the whole run. Memory then stays
flat however long the run; means stay exact; medians and percentiles carry the sketch's relative error, which
the summary states (``TimingSummary.sketch_relative_accuracy``). Runs shorter than the bound are summarised
exactly, as before. A fold of 250,000 steps takes about 12 ms of the training thread, once per 250,000 steps
(0.05 us a step; ``benchmarks/bench_step_memory.py``).
"""

from __future__ import annotations

import math
from array import array

import numpy as np
from ddsketch import DDSketch
from ddsketch.mapping import LogarithmicMapping

from lightning_perf.analysis.summary import MAX_SAMPLES, Distribution
from lightning_perf.analysis.verdicts.statistics import median_interval_ranks

# 250,000 steps x 24 bytes = 6 MB of arrays: a day of 350 ms steps is still summarised exactly.
EXACT_STEPS = 250_000
# Quantiles within 0.5% of the exact order statistic: well below the 1-5% a step time moves between runs on
# one machine (benchmarks/README.md), so no verdict turns on the sketch. About 1,000 bins span 1 us to 10 min.
SKETCH_RELATIVE_ACCURACY = 0.005


class StepQuantiles:
    """A DDSketch fed in bulk (numpy), with the exact count, sum, minimum and maximum beside it."""

    def __init__(self) -> None:
        self.sketch = DDSketch(SKETCH_RELATIVE_ACCURACY)
        mapping = LogarithmicMapping(SKETCH_RELATIVE_ACCURACY)  # the sketch's own mapping: same keys
        self._log_gamma = math.log(mapping.gamma)
        self._key_value = mapping.value
        self._min_possible = mapping.min_possible
        self.count = 0
        self.total = 0.0
        self.min = float("inf")
        self.max = float("-inf")

    def add_many(self, values: np.ndarray) -> None:
        """Add every value: one bucket key per value in numpy, then one ``add`` per distinct bucket.

        ``DDSketch.add`` costs ~1.5 us of Python a value; a window boundary folding 250,000 steps would stall
        training ~1 s. The keys are the sketch's own formula (``ceil(log_gamma(v))``), vectorised; each distinct
        key is added once, weighted by its count, at the bucket's representative value (which maps back to the
        same key). A value within a rounding error of a bucket edge may land in the neighbouring bucket: still
        within the stated relative accuracy.
        """
        if values.size == 0:
            return
        self.count += int(values.size)
        self.total += float(values.sum())
        self.min = min(self.min, float(values.min()))
        self.max = max(self.max, float(values.max()))
        positive = values[values > self._min_possible]
        zeros = values.size - positive.size  # a zero-length compute (the wait took the whole step)
        if zeros:
            self.sketch.add(0.0, float(zeros))
        if positive.size == 0:
            return
        keys = np.ceil(np.log(positive) / self._log_gamma).astype(np.int64)
        lowest = int(keys.min())
        counts = np.bincount(keys - lowest)  # keys span ~1,000 buckets at most: a count per bucket, no sort
        for offset in np.flatnonzero(counts).tolist():
            self.sketch.add(self._key_value(lowest + offset), float(counts[offset]))

    def distribution(self, tail: array) -> Distribution | None:
        """The run's distribution: this sketch merged with the exact ``tail`` not folded yet."""
        merged = StepQuantiles()
        merged.sketch.merge(self.sketch)
        merged.count, merged.total, merged.min, merged.max = self.count, self.total, self.min, self.max
        merged.add_many(np.frombuffer(tail, dtype=np.float64) if len(tail) else np.empty(0))
        n = merged.count
        if n == 0:
            return None

        def quantile(q: float) -> float:  # a float for any q: the sketch holds n > 0 values
            value = merged.sketch.get_quantile_value(q)
            return math.nan if value is None else value

        ranks = median_interval_ranks(n)
        return Distribution(
            count=n,
            mean=merged.total / n,
            median=quantile(0.5),
            p90=quantile(0.9),
            min=merged.min,
            max=merged.max,
            p10=quantile(0.1),
            median_low=quantile((ranks[0] - 1) / (n - 1)) if ranks else None,
            median_high=quantile((ranks[1] - 1) / (n - 1)) if ranks else None,
        )


class FoldedSteps:
    """The steps folded out of the clock's arrays: exact totals, sketches, an evenly spaced sample."""

    def __init__(self) -> None:
        self.count = 0
        self.samples = 0
        self.samples_known = True  # every folded batch's size was found
        self.step = StepQuantiles()
        self.wait = StepQuantiles()
        self.compute = StepQuantiles()
        # every ``stride``-th step of the run (indices 0, stride, 2*stride...), halved when it passes the cap
        self.stride = 1
        self.kept_step = array("d")
        self.kept_wait = array("d")

    def fold(self, step_ms: array, wait_ms: array, samples: array) -> None:
        step = np.frombuffer(step_ms, dtype=np.float64)
        wait = np.frombuffer(wait_ms, dtype=np.float64)
        self.step.add_many(step)
        self.wait.add_many(wait)
        self.compute.add_many(step - wait)
        sizes = np.frombuffer(samples, dtype=np.int64)
        self.samples_known = self.samples_known and bool((sizes >= 0).all())
        self.samples += int(sizes[sizes >= 0].sum())
        first = (-self.count) % self.stride
        self.kept_step.extend(step_ms[first :: self.stride])
        self.kept_wait.extend(wait_ms[first :: self.stride])
        self.count += len(step_ms)
        while len(self.kept_step) > 2 * MAX_SAMPLES:
            self.kept_step, self.kept_wait = self.kept_step[::2], self.kept_wait[::2]
            self.stride *= 2

    def spaced(self, step_tail: array, wait_tail: array) -> tuple[array, array]:
        """The run's evenly spaced steps and waits: the kept sample, then the tail at the same stride."""
        first = (-self.count) % self.stride
        return self.kept_step + step_tail[first :: self.stride], self.kept_wait + wait_tail[
            first :: self.stride
        ]
