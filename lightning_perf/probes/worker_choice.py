"""How the num_workers probe chooses from its measured candidates (pure: plain dicts in, a value and a reason out).

With 0 workers loading never overlaps the step, so every batch's load time is a wait however fast the loader is;
with N >= 1 workers the steady wait per step is about max(0, load time - compute time). A candidate that raised,
timed out or delivered too few batches for a rate is "not measured", never "not faster". Used by
:mod:`lightning_perf.probes.num_workers`.
"""

from __future__ import annotations

from typing import Any

from lightning_perf.analysis.rules.thresholds import (
    INPUT_BOUND_MODERATE_PCT,
    NEAR_BEST_STEP_PCT,
    WORKERS_MARGIN,
)

# Delivery must beat the model's compute rate by this factor (shared with the diagnosis' estimate).
DEFAULT_MARGIN = WORKERS_MARGIN
# num_workers=0 loads in the training process, never beside the step: it is acceptable only when that wait is
# below this share of its predicted step, TensorFlow's "moderately input-bound" line (thresholds.py).
ZERO_WORKERS_WAIT_PCT = INPUT_BOUND_MODERATE_PCT
# When no value keeps up, the smallest num_workers whose predicted step is within NEAR_BEST_STEP_PCT (thresholds.py)
# of the shortest is suggested.

MEASURED = "measured"
NOT_MEASURED = "not measured"


def _is_measured(candidate: dict[str, Any]) -> bool:
    """Measured with a rate; hand-built candidates without a ``status`` count when they have a rate and no error."""
    if candidate.get("batches_per_sec") is None:
        return False
    status = candidate.get("status")
    return status == MEASURED if status is not None else not candidate.get("error")


def _slowest_rate(candidate: dict[str, Any]) -> float | None:
    """The candidate's rate a selection uses: its slowest start's, or its overall rate."""
    repeats = candidate.get("repeat_rates") or []
    return min(repeats) if repeats else candidate.get("batches_per_sec")


def predicted_wait_ms(
    candidate: dict[str, Any], compute_batches_per_sec: float | None, handoff_main_ms: float = 0.0
) -> float | None:
    """The loop's predicted wait for data per step with this candidate, from its slowest start's rate.

    0 workers: loading never overlaps the step, so the whole load time of a batch (1000 / rate) is waited.
    N >= 1 workers, steady state: they load while the step computes, so the wait is what loading takes beyond
    the compute time, and at least the training thread's share of each batch's hand-off (``handoff_main_ms``,
    :mod:`lightning_perf.probes.handoff`), which no worker takes off it: max(handoff_main_ms, 1000 / rate -
    compute_ms). ``None`` when not measured or without a compute rate.
    """
    rate = _slowest_rate(candidate) if _is_measured(candidate) else None
    if rate is None or rate <= 0 or compute_batches_per_sec is None:
        return None
    load_ms = 1000.0 / rate
    if candidate["num_workers"] == 0:
        return load_ms
    return max(handoff_main_ms, load_ms - 1000.0 / compute_batches_per_sec)


def acceptable(candidate: dict[str, Any], compute_batches_per_sec: float, margin: float) -> bool:
    """0 workers: the predicted wait under ``ZERO_WORKERS_WAIT_PCT`` of the step; N >= 1: the slowest start's
    rate at least ``margin`` x the model's."""
    if not _is_measured(candidate):
        return False
    if candidate["num_workers"] == 0:
        wait = predicted_wait_ms(candidate, compute_batches_per_sec)
        step = 1000.0 / compute_batches_per_sec + (wait or 0.0)
        return wait is not None and wait < ZERO_WORKERS_WAIT_PCT / 100.0 * step
    return (_slowest_rate(candidate) or 0.0) >= margin * compute_batches_per_sec


def _rate_text(candidate: dict[str, Any]) -> str:
    repeats = candidate.get("repeat_rates") or []
    text = f"{candidate['batches_per_sec']:.1f} batches/s"
    if len(repeats) > 1:
        text += f" ({min(repeats):.1f}-{max(repeats):.1f} over {len(repeats)} fresh starts)"
    return text


def _why(candidate: dict[str, Any]) -> str:
    """The candidate's error on one line: a worker's error carries its traceback, whose last line is the cause."""
    lines = [line.strip() for line in str(candidate.get("error") or "no rate").splitlines() if line.strip()]
    if not lines:
        return "no rate"
    return lines[0] if len(lines) == 1 or lines[-1] == lines[0] else f"{lines[0]} ... {lines[-1]}"


def _not_measured_text(candidates: list[dict[str, Any]]) -> str:
    """``num_workers=1, 2: not measured (why)`` for the candidates without a rate, grouped by reason."""
    groups: dict[str, list[str]] = {}
    for candidate in candidates:
        if not _is_measured(candidate):
            why = _why(candidate)
            groups.setdefault(why, []).append(str(candidate["num_workers"]))
    return "; ".join(
        f"num_workers={', '.join(counts)}: {NOT_MEASURED} ({why})" for why, counts in groups.items()
    )


def rates_list(candidates: list[dict[str, Any]]) -> str:
    """Every candidate's rate, or why it has none."""
    parts = [
        f"num_workers={c['num_workers']}: {_rate_text(c)}"
        if _is_measured(c)
        else f"num_workers={c['num_workers']}: {NOT_MEASURED} ({_why(c)})"
        for c in candidates
    ]
    return ", ".join(parts) if parts else "nothing"


def _zero_text(measured: list[dict[str, Any]], compute_batches_per_sec: float) -> str:
    """``against X ms with num_workers=0 (no overlap)`` where 0 was measured."""
    zero = next((c for c in measured if c["num_workers"] == 0), None)
    wait = predicted_wait_ms(zero, compute_batches_per_sec) if zero is not None else None
    return "" if wait is None else f" against {wait:.1f} ms with num_workers=0 (no overlap)"


def suggest_from_candidates(
    candidates: list[dict[str, Any]],
    compute_batches_per_sec: float | None,
    margin: float = DEFAULT_MARGIN,
    handoff_main_ms: float = 0.0,
) -> tuple[int | None, str]:
    """The suggestion and its reason from the tried candidates (in increasing ``num_workers``).

    With a compute rate: the smallest acceptable value (0 when its predicted wait, paid in full, is under
    ``ZERO_WORKERS_WAIT_PCT`` of its predicted step; N >= 1 when its slowest rate is at least ``margin`` x the
    model's), else the value with the shortest predicted step, the smallest within ``NEAR_BEST_STEP_PCT`` of it.
    Without one: the smallest value within ``margin`` of the fastest. Candidates not measured are never taken
    for slower: the reason names them and why.
    """
    measured = [c for c in candidates if _is_measured(c)]
    unmeasured = _not_measured_text(candidates)
    tail = f"; {unmeasured}" if unmeasured else ""
    if not measured:
        return None, "no candidate was measured, so no value is chosen" + (
            f": {unmeasured}" if unmeasured else ""
        )
    if compute_batches_per_sec is None:
        fastest = max(measured, key=lambda c: c["batches_per_sec"])
        line = fastest["batches_per_sec"] / margin
        within = next(c for c in measured if c["batches_per_sec"] >= line)
        return within["num_workers"], (
            f"no compute rate measured: num_workers={within['num_workers']} delivers "
            f"{within['batches_per_sec']:.1f} batches/s, within {margin:g}x of the fastest measured "
            f"({fastest['batches_per_sec']:.1f} batches/s with {fastest['num_workers']})" + tail
        )
    compute_ms = 1000.0 / compute_batches_per_sec
    model = f"the model's {compute_batches_per_sec:.1f} batches/s"
    pick = next((c for c in measured if acceptable(c, compute_batches_per_sec, margin)), None)
    zero = next((c for c in measured if c["num_workers"] == 0), None)
    if pick is not None and pick["num_workers"] > 0 and zero is not None:
        # workers that keep up still leave the training thread its share of each hand-off: where that is more
        # than the whole fetch without workers, 0 is the faster choice
        zero_wait = predicted_wait_ms(zero, compute_batches_per_sec) or 0.0
        if zero_wait <= (predicted_wait_ms(pick, compute_batches_per_sec, handoff_main_ms) or 0.0):
            return 0, (
                f"num_workers=0 delivers {_rate_text(zero)}: its predicted wait, {zero_wait:.1f} ms a step, is no "
                f"more than the {handoff_main_ms:.2f} ms the training thread spends receiving each batch from a "
                "worker" + tail
            )
    if pick is not None and pick["num_workers"] == 0:
        wait = predicted_wait_ms(pick, compute_batches_per_sec) or 0.0
        return 0, (
            f"num_workers=0 delivers {_rate_text(pick)}: its predicted wait, {wait:.1f} ms a step (loading "
            f"never overlaps the step without workers), is {100.0 * wait / (compute_ms + wait):.1f}% of the "
            f"predicted {compute_ms + wait:.1f} ms step, below {ZERO_WORKERS_WAIT_PCT:g}%" + tail
        )
    if pick is not None:
        slowest = "even in its slowest start, " if len(pick.get("repeat_rates") or []) > 1 else ""
        wait = predicted_wait_ms(pick, compute_batches_per_sec, handoff_main_ms) or 0.0
        return pick["num_workers"], (
            f"num_workers={pick['num_workers']} delivers {_rate_text(pick)}, {slowest}at least {margin:g}x "
            f"{model}: predicted wait {wait:.1f} ms a step{_zero_text(measured, compute_batches_per_sec)}"
            + tail
        )

    def step(candidate: dict[str, Any]) -> float:
        return compute_ms + (predicted_wait_ms(candidate, compute_batches_per_sec, handoff_main_ms) or 0.0)

    best = min(step(c) for c in measured)
    pick = next(c for c in measured if step(c) <= best * (1.0 + NEAR_BEST_STEP_PCT / 100.0))
    wait = step(pick) - compute_ms
    head = (
        "the input pipeline cannot keep up: no measured value does"
        if wait > 0
        else "no measured value keeps up"
    )
    return pick["num_workers"], (
        f"{head} (1 or more workers at {margin:g}x {model}, or 0 with a wait under "
        f"{ZERO_WORKERS_WAIT_PCT:g}% of its step); num_workers={pick['num_workers']} has the shortest predicted "
        f"step, {step(pick):.1f} ms, delivering {_rate_text(pick)}: predicted wait {wait:.1f} ms a step"
        f"{_zero_text(measured, compute_batches_per_sec) if pick['num_workers'] else ''}" + tail
    )
