"""The trial's progress on stderr: one tqdm bar over every step of every round, with its ETA, and a line per
finished round written above the bar (so lines never glue onto it), naming a round the machine's other work
disturbed. While a round reports no new step the bar says for how long and when the round will be stopped (it
never freezes silently), and after :data:`STALL_LINE_S` a line says so."""

from __future__ import annotations

import contextlib
import sys
import threading
import time

from tqdm.auto import tqdm

from lightning_perf.trial.runner import disturbance
from lightning_perf.trial.spec import VariantResult

# no new step for this long: the bar says how long it has waited (refreshed every STALL_TICK_S)
STALL_NOTE_S = 10.0
STALL_TICK_S = 5.0
# no new step for this long: a line above the bar says so, once until a step comes
STALL_LINE_S = 60.0


class Progress:
    """A bar over ``rounds * variants * steps`` steps; :meth:`start`, :meth:`step`, :meth:`finished` per round,
    :meth:`limit` when the running round's time limit is known (``run_worker``'s ``on_limit``)."""

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
        self._steps = self._round_steps = steps
        self._round_started = self._last_step_at = time.monotonic()
        self._limit_s: float | None = None
        self._shown_at: str | None = (
            None  # the time of day the stall note last gave, and whether it moved since
        )
        self._moved = False
        self._running = False
        self._stall_said = False
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if enabled:
            self._ticker = threading.Thread(target=self._tick, name="lightning-perf-progress", daemon=True)
            self._ticker.start()

    def add_round(self) -> None:
        """One more round than planned (the verdict was undecided): the bar grows by it."""
        self.rounds += 1
        self.bar.total = (self.bar.total or 0) + self.variants * self._round_steps
        self.bar.refresh()

    def start(self, round_index: int, variant_index: int, name: str, steps: int) -> None:
        round_part = f"round {round_index}/{self.rounds} " if self.rounds > 1 else ""
        self.prefix = f"[{round_part}{variant_index}/{self.variants}] {name}: "
        self.bar.set_description(f"{round_part}{name}".strip())
        self._done, self._steps = 0, steps
        self._round_started = self._last_step_at = time.monotonic()
        self._limit_s, self._running, self._stall_said = None, True, False
        self._shown_at, self._moved_from = None, None
        self._clear_note()

    def step(self, done: int, steps: int) -> None:
        if done > self._done:
            self._last_step_at, self._stall_said = time.monotonic(), False
            self._clear_note()
            self.bar.update(done - self._done)
            self._done = done

    def limit(self, seconds: float, why: str = "") -> None:
        """The running round is stopped ``seconds`` after its start (``why``: how that was set)."""
        self._moved = (
            self._shown_at is not None and self._limit_s is not None and seconds > self._limit_s + 1.0
        )
        self._limit_s = seconds

    def stalled(self, now: float | None = None) -> str | None:
        """The note while the running round reports no new step: for how long, and when it will be stopped."""
        now = time.monotonic() if now is None else now
        waited = now - self._last_step_at
        if not self._running or waited < STALL_NOTE_S:
            return None
        ending = self._done >= self._steps  # every step done: the fit is ending (summary, clean-up)
        text = (
            f"ending for {waited:.0f} s after the last step" if ending else f"no new step for {waited:.0f} s"
        )
        if self._limit_s is not None:
            # a time of day, fixed while the limit holds, and the seconds left, falling: a deadline that reads
            # the same at every refresh (a limit the round's own pace moves later says so)
            left = max(0.0, self._limit_s - (now - self._round_started))
            at = _clock(time.time() + left - (time.monotonic() - now))
            moved = (
                f", later than the {self._shown_at} said before: the round's pace set it"
                if self._moved
                else ""
            )
            text += f"; stopped at {at} if none comes ({left:.0f} s left{moved})"
            self._shown_at = at
        return text

    def finished(self, result: VariantResult, wall_s: float, mean_ms: float | None) -> None:
        self._running = False
        self.step(self._steps, self._steps)  # a failed or short round still moves the bar to its end
        if result.ok or result.error is None:
            detail = f" (mean step {mean_ms:.1f} ms)" if mean_ms is not None else ""
            disturbed = disturbance(result.rounds[-1]) if result.rounds else None
            self.say(f"done in {wall_s:.1f} s{detail}" + (f"; disturbed: {disturbed}" if disturbed else ""))
        else:
            log = f" (log: {result.log_path})" if result.log_path else ""
            self.say(f"FAILED: {result.error}{log}")

    def say(self, text: str) -> None:
        if self.enabled:
            self.bar.write(f"{self.prefix}{text}", file=sys.stderr)

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=2 * STALL_TICK_S)
        self.bar.close()

    def _clear_note(self) -> None:
        if getattr(self.bar, "postfix", None):  # a disabled bar has none
            self.bar.set_postfix_str("", refresh=False)

    def _tick(self) -> None:
        while not self._stop.wait(STALL_TICK_S):
            note = self.stalled()
            if note is None:
                continue
            with contextlib.suppress(Exception):  # the bar is being closed: nothing left to say
                self.bar.set_postfix_str(note)  # refreshes the bar: its elapsed time moves
                if time.monotonic() - self._last_step_at >= STALL_LINE_S and not self._stall_said:
                    self._stall_said = True
                    self.say(f"{note} (at step {self._done}/{self._steps})")


def _clock(epoch_s: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(epoch_s))
