"""How lightning-perf tells the user things: Python logging under the ``lightning_perf`` logger.

Every module logs through a child logger (``console.logger(__name__)``, e.g. ``lightning_perf.collect.sampling.utilization``)
that propagates, so the user's logging set-up routes, filters or silences it as it does for Lightning's own
messages (``logging.getLogger("lightning_perf").setLevel(logging.WARNING)`` silences the info lines).
``warnings.warn`` is kept for misuse only (an argument that works against its purpose).

- Visible by default, as Lightning's own lines are: the ``lightning_perf`` logger is at INFO unless the user set
  a level, and while no handler of the user's (on the root logger or on ours) would print a record, one handler
  of ours prints it to stderr.
- Never glued onto a progress bar: that handler writes through ``tqdm.write``, which clears the bars of the
  terminal (Lightning's TQDMProgressBar draws them with tqdm), writes the line and draws them again; under
  RichProgressBar, rich redirects stderr above its live display.
- Rank-zero: under DDP, records from ranks other than 0 are dropped (as Lightning's ``rank_zero_info`` does),
  unless logged with ``extra={"all_ranks": True}``.

Also here: :func:`quiet_kineto`, which keeps torch's profiler back end from printing its harmless start-up lines
on machines without CUDA. Imports nothing from torch or Lightning.
"""

from __future__ import annotations

import logging
import os
import sys

ROOT_LOGGER = "lightning_perf"

# Kineto (torch.profiler's back end) reads this when the first profiler of the process starts. Its levels
# are VERBOSE 0, INFO 1, WARNING 2, STAGE 3, ERROR 4, USDT 5; 6 is above all of them, which hides the
# "USDT ... profiler_start" and "ERROR ... gpuGetDeviceCount failed" lines it prints on a machine without
# CUDA (checked with torch 2.14: 5 still prints the USDT lines, 6 prints nothing).
KINETO_LOG_LEVEL_ENV = "KINETO_LOG_LEVEL"
KINETO_QUIET_LEVEL = "6"


def global_rank() -> int:
    """This process's global rank as Lightning knows it (0 without Lightning loaded or without DDP)."""
    # read from the rank_zero_only of whichever Lightning namespace is loaded, without importing one
    for name in ("lightning.fabric.utilities.rank_zero", "lightning_fabric.utilities.rank_zero"):
        module = sys.modules.get(name)
        rank = getattr(getattr(module, "rank_zero_only", None), "rank", 0)
        if rank:
            return int(rank)
    return 0


class _RankZeroFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return getattr(record, "all_ranks", False) or global_rank() == 0


class _ProgressBarAwareHandler(logging.Handler):
    """Prints our records on stderr, between progress-bar redraws, when no handler of the user's would."""

    def emit(self, record: logging.LogRecord) -> None:
        if _user_handles(logging.getLogger(ROOT_LOGGER)):
            return
        try:
            message = self.format(record)
            stream = sys.stderr  # looked up now: pytest and rich replace it
            try:
                from tqdm import tqdm
            except ImportError:  # tqdm comes with Lightning; without it there is no bar to keep clear
                stream.write(message + "\n")
            else:
                tqdm.write(message, file=stream)
        except Exception:
            self.handleError(record)


def _user_handles(logger: logging.Logger) -> bool:
    """Whether a handler other than ours receives records of ``logger`` (walking up as propagation does)."""
    current: logging.Logger | None = logger
    while current is not None:
        if any(not isinstance(h, _ProgressBarAwareHandler) for h in current.handlers):
            return True
        if not current.propagate:
            return False
        current = current.parent
    return False


_RANK_ZERO = _RankZeroFilter()


def _install() -> logging.Logger:
    root = logging.getLogger(ROOT_LOGGER)
    if not any(isinstance(h, _ProgressBarAwareHandler) for h in root.handlers):
        handler = _ProgressBarAwareHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(handler)
    if root.level == logging.NOTSET:  # a level the user chose stays
        root.setLevel(logging.INFO)
    if _RANK_ZERO not in root.filters:
        root.addFilter(_RANK_ZERO)
    return root


def logger(name: str = ROOT_LOGGER) -> logging.Logger:
    """The logger for module ``name`` (a child of ``lightning_perf``), rank-zero aware."""
    _install()
    log = logging.getLogger(name)
    # a logger's filters see only the records logged on it, so every child gets the rank filter
    if _RANK_ZERO not in log.filters:
        log.addFilter(_RANK_ZERO)
    return log


def quiet_kineto(cuda_available: bool) -> None:
    """Hide Kineto's console lines on a machine without CUDA, unless the user set ``KINETO_LOG_LEVEL``.

    Call before the first torch profiler of the process starts (Kineto reads the variable once, then).
    """
    if not cuda_available:
        os.environ.setdefault(KINETO_LOG_LEVEL_ENV, KINETO_QUIET_LEVEL)
