"""The trial's progress on stderr: one tqdm bar over every step of every round, with its ETA, and a line per
finished round written above the bar (so lines never glue onto it)."""

from __future__ import annotations

import sys

from tqdm.auto import tqdm

from lightning_perf.trial.spec import VariantResult


class Progress:
    """A bar over ``rounds * variants * steps`` steps; :meth:`start`, :meth:`step`, :meth:`finished` per round."""

    def __init__(self, rounds: int, variants: int, steps: int, enabled: bool = True) -> None:
        self.rounds = rounds
        self.variants = variants
        self.enabled = enabled
        self.bar = tqdm(
            total=rounds * variants * steps,
            unit="step",
            file=sys.stderr,
            disable=not enabled,
            dynamic_ncols=True,
            leave=False,
        )
        self.prefix = ""
        self._done = 0
        self._steps = steps

    def start(self, round_index: int, variant_index: int, name: str, steps: int) -> None:
        round_part = f"round {round_index}/{self.rounds} " if self.rounds > 1 else ""
        self.prefix = f"[{round_part}{variant_index}/{self.variants}] {name}: "
        self.bar.set_description(f"{round_part}{name}".strip())
        self._done, self._steps = 0, steps

    def step(self, done: int, steps: int) -> None:
        if done > self._done:
            self.bar.update(done - self._done)
            self._done = done

    def finished(self, result: VariantResult, wall_s: float, mean_ms: float | None) -> None:
        self.step(self._steps, self._steps)  # a failed or short round still moves the bar to its end
        if result.ok or result.error is None:
            detail = f" (mean step {mean_ms:.1f} ms)" if mean_ms is not None else ""
            self.say(f"done in {wall_s:.1f} s{detail}")
        else:
            log = f" (log: {result.log_path})" if result.log_path else ""
            self.say(f"FAILED: {result.error}{log}")

    def say(self, text: str) -> None:
        if self.enabled:
            self.bar.write(f"{self.prefix}{text}", file=sys.stderr)

    def close(self) -> None:
        self.bar.close()
