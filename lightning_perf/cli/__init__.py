"""The ``lightning-perf`` command line: one module a command, each parsing arguments and calling the library.

Each command module provides ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType

from lightning_perf import __version__

COMMANDS = {
    "compare": "lightning_perf.cli.compare",
    "trial": "lightning_perf.cli.trial",
    "report": "lightning_perf.cli.report",
    "tune": "lightning_perf.cli.tune",
    "capture": "lightning_perf.cli.capture",
}


def build_parser(modules: dict[str, ModuleType]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lightning-perf",
        description="Performance profiling, diagnosis and comparison for PyTorch Lightning runs.",
    )
    parser.add_argument("--version", action="version", version=f"lightning-perf {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in modules.items():
        cmd = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
    return parser


def _command_modules() -> dict[str, ModuleType]:
    return {name: importlib.import_module(path) for name, path in COMMANDS.items()}


def main(argv: list[str] | None = None) -> int:
    modules = _command_modules()
    parser = build_parser(modules)
    argv = list(sys.argv[1:] if argv is None else argv)
    # `tune ... -- COMMAND ARGS...`: everything after the first `--` is the user's command, never our options
    user_command = argv[argv.index("--") + 1 :] if "--" in argv else None
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    args.user_command = user_command
    if args.command is None:
        parser.print_help()
        return 0
    return int(modules[args.command].run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
