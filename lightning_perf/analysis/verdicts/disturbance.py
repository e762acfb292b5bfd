"""Whether other work on the machine could explain a measured difference, round by round (pure).

A round that others' processes disturbed is slower by at most what they took: at worst all of their CPU time came
out of this run's, so a share ``s`` of the machine's cores makes a CPU-bound round at most ``1 / (1 - s)`` slower
(the bound ``noisy_machine`` states as "up to ~s% on CPU-bound steps"). A paired ratio (baseline time over
candidate time, in the same round) can then be off by the larger of the two sides' bounds, either way. A candidate
faster in every round by more than that round's bound is faster whatever the disturbance did: its verdict need not
wait for a quiet machine. The rounds' own step-to-step spread is no part of the bound: it is a single step's, and a
round's figure is the mean of its many steps; the spread between rounds is what the interval already carries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# a ratio within this factor of 1 is no difference even in a quiet round (as decision.NO_DIFFERENCE)
QUIET_BOUND = 1.05
# the largest share of the cores counted: beyond it the bound (10x) says only that anything could be explained
MAX_SHARE = 0.9


def round_bound(*other_shares: float | None) -> float:
    """How far a paired ratio can be off in a round where the pair's sides saw ``other_shares`` (others' share of
    the cores, 0-1, None where unrecorded) taken by other processes: the larger side's ``1 / (1 - s)``, at least
    :data:`QUIET_BOUND`."""
    shares = [min(max(s, 0.0), MAX_SHARE) for s in other_shares if s is not None]
    worst = max(shares, default=0.0)
    return max(QUIET_BOUND, 1.0 / (1.0 - worst))


@dataclass(frozen=True)
class Beyond:
    """A candidate's speed-ups round by round against each round's bound."""

    ratios: tuple[float, ...]
    bounds: tuple[float, ...]

    @property
    def faster_beyond_disturbance(self) -> bool:
        """Faster in every round (two at least) by more than the round's disturbance could explain."""
        return len(self.ratios) >= 2 and all(r > b for r, b in zip(self.ratios, self.bounds, strict=True))

    def describe(self) -> str:
        """``faster in each of 3 rounds (1.52-8.10x), beyond what the others' work could explain (at most
        1.18x a round)``."""
        return (
            f"faster in each of {len(self.ratios)} rounds ({min(self.ratios):.2f}-{max(self.ratios):.2f}x), "
            f"beyond what other work on the machine could explain (at most {max(self.bounds):.2f}x a round)"
        )


def beyond(ratios: Sequence[float], bounds: Sequence[float]) -> Beyond:
    return Beyond(tuple(ratios), tuple(bounds))
