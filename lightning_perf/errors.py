"""The one base class of every error lightning-perf raises on purpose.

``except LightningPerfError`` catches them all; each still derives from the built-in class it always had
(``ValueError`` for bad values), so existing ``except ValueError`` code keeps working.
"""


class LightningPerfError(Exception):
    """Base of lightning-perf's own errors; the message names the argument, file or device concerned."""


class ConfigError(LightningPerfError, ValueError):
    """An argument is invalid; the message names the argument, the value and what is allowed. PerfCallback's
    settings raise it at construction, before any training step."""


def exit_if_cli(err: ConfigError, owner: str) -> None:
    """End the process as a command line's own argument errors do, when ``owner`` is being built by one.

    jsonargparse (``LightningCLI``, ``jsonargparse.CLI``) builds the classes of a YAML config after parsing it;
    a ``ValueError`` raised there reaches the user as a traceback of some 90 lines through its Union checks,
    the message buried in it. Under such a parser this writes ``error: <owner>: <message>`` (the message names
    the argument, the value and what is allowed) as the last line on stderr and exits with code 2, as the
    parser does for an argument it rejects itself. It returns when ``owner`` is built by ordinary code, where
    the caller raises ``err`` as usual.
    """
    import sys
    from types import FrameType

    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).startswith("jsonargparse."):
            sys.stderr.write(f"error: {owner}: {err}\n")
            sys.stderr.flush()
            raise SystemExit(2) from err
        frame = frame.f_back
