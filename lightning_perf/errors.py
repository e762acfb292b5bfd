"""The one base class of every error lightning-perf raises on purpose.

``except LightningPerfError`` catches them all; each still derives from the built-in class it always had
(``ValueError`` for bad values), so existing ``except ValueError`` code keeps working.
"""


class LightningPerfError(Exception):
    """Base of lightning-perf's own errors; the message names the argument, file or device concerned."""


class ConfigError(LightningPerfError, ValueError):
    """An argument is invalid; raised at construction, before any training step. Names the argument, the
    value and what is allowed."""
