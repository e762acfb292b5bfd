"""How many DataLoader workers a run wants once each worker's hand-off of a batch is charged.

A worker's batch is pickled, queued through shared memory and rebuilt by the training process: a cost per batch
that 0 workers never pay (``summary.probes.handoff``, measured by :mod:`lightning_perf.probes.handoff`: the
wall time per batch ``H`` one worker needs to deliver a ready batch, and the training thread's own share ``h``).
With a batch's load time ``L`` and compute time ``C``, the step is about

* 0 workers: ``C + L`` (loading never overlaps the step);
* N workers: ``C + max(h, margin * (L + H) / N - C)``: each worker loads and hands over its batch while the step
  computes, and the training thread pays its share of the hand-off whatever N is.

So workers are worth having only where the fetch costs more than the hand-off, and fewer workers (down to 0) are
advised where the hand-off is the wait. ``L`` comes from the run: the mean wait with 0 workers (the whole fetch);
with N workers the batches the hand-off measurement fetched in the training process after the fit, or else
``N x step - H`` (workers that keep the loop waiting deliver one batch every N steps), an upper bound when they do
not, which can only keep workers, never take them away wrongly.

Pure: reads a :class:`RunSummary`, imports nothing from Lightning or torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning_perf.analysis.numbers import finite as _num
from lightning_perf.analysis.numbers import fmt1 as _fmt
from lightning_perf.analysis.rules.helpers import others_busy
from lightning_perf.analysis.rules.thresholds import NEAR_BEST_STEP_PCT, WORKERS_MARGIN
from lightning_perf.analysis.summary import RunSummary

# The most a run's own worker count is multiplied by in one piece of advice (see charged_choice).
MAX_GROWTH = 2
# The compute a step keeps after the workers' crowding is taken off: at least this share of what was measured
# (our choice: the run-queue share is of the whole run, fetches included, so it can over-state the step's part).
MIN_COMPUTE_SHARE = 0.2


@dataclass(frozen=True)
class HandOffCost:
    per_batch_ms: float  # one worker's steady wall time per ready batch delivered
    main_ms: float  # the training thread's CPU time per batch received
    batch_bytes: int
    # a batch fetched in the training process with 0 workers, timed after the fit
    load_ms: float | None = None
    touch_ms: float = 0.0  # the training thread's first reads of a received batch's pages

    def describe(self) -> str:
        size = f" for {_bytes(self.batch_bytes)}" if self.batch_bytes else ""
        return (
            f"a worker hands a batch over in {_ms(self.per_batch_ms)} ms{size} (measured, "
            f"{_ms(self.main_ms)} ms of it in the training thread)"
        )


def handoff_of(summary: RunSummary) -> HandOffCost | None:
    """The measured hand-off of the run's batch, or ``None`` when it was not measured."""
    probe = summary.probes.handoff
    if probe is None:
        return None
    per_batch, main, load = _num(probe.ms_per_batch), _num(probe.main_ms), _num(probe.load_ms)
    if per_batch is None or per_batch <= 0:
        return None
    return HandOffCost(
        per_batch,
        max(0.0, main or 0.0),
        probe.batch_bytes,
        load if load and load > 0 else None,
        max(0.0, _num(probe.touch_ms) or 0.0),
    )


def predicted_step_ms(workers: int, load_ms: float, compute_ms: float, handoff: HandOffCost) -> float:
    """The step with ``workers`` workers (see the module's docstring)."""
    if workers == 0:
        return compute_ms + load_ms
    per_worker = WORKERS_MARGIN * (load_ms + handoff.per_batch_ms) / workers
    return compute_ms + max(handoff.main_ms, per_worker - compute_ms)


def load_and_compute_ms(summary: RunSummary, handoff: HandOffCost) -> tuple[float, float] | None:
    """(a batch's load time, its compute time) from the run's means; ``None`` without them."""
    timing, current = summary.timing, summary.settings.num_workers
    step, wait = timing.step_time_ms, timing.data_wait_ms
    if current is None or step is None or wait is None:
        return None
    compute = step.mean - wait.mean
    if (
        timing.gpu_compute_ms is not None
    ):  # the GPU's own time: host compute is understated when it runs ahead
        compute = timing.gpu_compute_ms.mean
    if compute <= 0:
        return None
    if current == 0:  # the run's own fetches, every step
        if handoff.load_ms is not None and others_busy(summary):
            # others held the cores: the run's fetches waited for them too (a 0.035 ms in-memory fetch read 0.82 ms
            # on the mean, 25.9 ms at most, beside two CPU hogs); the same fetch timed after the fit is the cleaner
            return min(wait.mean, handoff.load_ms), compute
        return wait.mean, compute
    compute = max(MIN_COMPUTE_SHARE * compute, compute - crowding_ms(summary, handoff))
    if handoff.load_ms is not None:  # timed in this process after the fit
        return handoff.load_ms, compute
    return max(0.0, current * step.mean - handoff.per_batch_ms), compute


def crowding_ms(summary: RunSummary, handoff: HandOffCost) -> float:
    """What the run's workers added to each step's compute: the training thread's wait for a core (its run-queue
    share of the step, counted only while no other process busied the machine: then the crowding is the run's
    own) and its first reads of each received batch's shared memory (``touch_ms``)."""
    added = handoff.touch_ms
    machine, step = summary.machine, summary.timing.step_time_ms
    if machine is None or step is None:
        return added
    queue = _num(machine.train_thread_runqueue_pct)
    if queue is not None and _num(machine.other_cores) is not None and not others_busy(summary):
        added += queue / 100.0 * step.mean
    return added


def charged_choice(summary: RunSummary, cap: int | None) -> tuple[int | None, str] | None:
    """(num_workers or ``None`` for "keep the run's", why) from the measured hand-off; ``None`` when the hand-off,
    the run's means or its worker count are unknown. Counts tried: 0, the run's, powers of two up to ``cap``
    (and ``cap``; at most ``MAX_GROWTH`` times a count the run has); the run's own count has its measured step,
    the others their predicted one; advised: the fewest whose step is within ``NEAR_BEST_STEP_PCT`` of the
    shortest, and only when the run's own count is not."""
    handoff = handoff_of(summary)
    current = summary.settings.num_workers
    if handoff is None or current is None:
        return None
    means = load_and_compute_ms(summary, handoff)
    step, wait = summary.timing.step_time_ms, summary.timing.data_wait_ms
    if means is None or step is None or wait is None:  # the means need both
        return None
    load, compute = means
    top = max(cap or 1, current)
    if current > 0:
        # one doubling a time from a run that has workers: every worker's hand-off takes CPU the model does not
        # see, and on a busy 2-core machine 4 -> 16 workers measured 0.66x; the next run measures the next step
        top = min(top, max(current, MAX_GROWTH * current))
    counts = sorted({0, current, top, *(1 << k for k in range(top.bit_length()) if 1 << k <= top)})
    steps = {n: predicted_step_ms(n, load, compute, handoff) for n in counts}
    # the run's own count has its step measured over the whole run, unless its fetches were timed again apart from
    # the busy cores (then its step is the same model's, compute plus that load: one yardstick for every count)
    cleaned = current == 0 and load < wait.mean
    how = "predicted" if cleaned else "measured"
    if not cleaned:
        steps[current] = step.mean
    best = min(steps.values())
    near = best * (1.0 + NEAR_BEST_STEP_PCT / 100.0)
    if cleaned:
        source = (
            "fetched in the training process after the fit: the run's own fetches waited for the busy cores"
        )
    elif current == 0:
        source = "the run's fetches in the training thread"
    elif handoff.load_ms is not None:
        source = "fetched in the training process after the fit, no workers"
    else:
        source = f"{workers_phrase(current)} x the step, less the hand-off"
    basis = (
        f"a batch takes ~{_ms(load)} ms to load ({source}) and {_ms(compute)} ms to compute, and "
        f"{handoff.describe()}"
    )
    if steps[current] <= near:
        others = ", ".join(f"{_ms(steps[n])} ms with {n}" for n in counts if n != current)
        return None, (
            f"{basis}: {how} step {_ms(steps[current])} ms with {workers_phrase(current)}, predicted {others}; "
            f"no count is {NEAR_BEST_STEP_PCT:g}% faster"
        )
    pick = min(n for n in counts if steps[n] <= near)
    if pick < current:
        head = (
            "the hand-off costs more than the loading it moves off the training thread"
            if handoff.per_batch_ms >= load
            else "each batch's hand-off costs more than overlapping its loading saves"
        )
    else:
        head = "the loading costs more than its hand-off, so workers overlap it with the step"
    return pick, (
        f"{head}: {basis}; predicted step {_ms(steps[pick])} ms with {workers_phrase(pick)} against "
        f"{_ms(steps[current])} ms {how} with {workers_phrase(current)}"
    )


def workers_phrase(count: int | None) -> str:
    """``1 worker``, ``4 workers``: also the words of rules/loading.py."""
    return "1 worker" if count == 1 else f"{count} workers"


def _ms(value: float) -> str:
    return f"{value:.2f}" if value < 10 else _fmt(value)


def _bytes(count: int) -> str:
    for unit, size in (("MB", 1e6), ("KB", 1e3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} bytes"
