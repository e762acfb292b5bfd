"""The command ``lightning-perf tune/trial --config CFG.yaml [--cli MODULE:ATTR]`` runs: a Lightning CLI built
with the config, as any training command runs (:mod:`lightning_perf.trial.project.command`)::

    python -m lightning_perf.trial.project.cli_main [--lightning-perf-cli=MODULE:ATTR] --config CFG.yaml [--key=value ...]

A round's settings are applied inside it at run time by the bootstrap, as in the user's own command
(:mod:`lightning_perf.trial.project.inject`: the Trainer's steps and logger, the DataLoader and compute settings, the
facts that name the winner in the config's keys); a variant's config keys (``data.init_args.batch_size=8``) are
arguments after the config. The CLI has no subcommands and fits once; the config's ``ckpt_path`` (a config saved by
``fit`` holds it) is accepted and ignored.

``--cli`` names how to build the CLI for a config with plain ``model:``/``data:`` sections: a LightningCLI subclass
(its own fixed classes, or the classes its module's script gives it at the call site, ``MyCLI(MyModel, MyData)``,
read from that call), a LightningModule class, or a function returning either or ``(model class, datamodule
class)``. A subclass whose classes cannot be found fails before any fit, in one line naming the command form that
runs it as the script does.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import os
import shlex
import sys
from typing import Any

from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI
from typing_extensions import override

from lightning_perf import console
from lightning_perf.trial.project.command import CLI_FLAG
from lightning_perf.trial.runner import describe_error, protocol_line

# the CLI's default seed (a config's seed_everything wins): every variant starts from the same weights and data
TRIAL_SEED = 0
# arguments of LightningCLI the entry owns; a call site's other literal arguments (trainer_defaults...) are kept
OWNED = ("args", "run", "save_config_callback", "parser_kwargs", "model_class", "datamodule_class")
log = console.logger(__name__)


class _AcceptsCkptPath(LightningCLI):
    """Accepts the ``ckpt_path`` a config saved by ``fit`` holds (a trial starts fresh and ignores it)."""

    @override
    def add_arguments_to_parser(self, parser: Any) -> None:
        super().add_arguments_to_parser(parser)
        parser.add_argument(
            "--ckpt_path", type=str | None, default=None, help="ignored: a trial starts fresh"
        )


class TrialCLI(_AcceptsCkptPath):
    """The Lightning CLI without subcommands, accepting a config saved by ``fit`` (it holds ``ckpt_path``)."""


def _is_class(value: Any, base: type) -> bool:
    return isinstance(value, type) and issubclass(value, base)


def _resolve(node: ast.expr, module: Any) -> Any:
    """The object a name or dotted name of ``module`` (``TinyModel``, ``models.Tiny``) holds, else None."""
    if isinstance(node, ast.Name):
        return getattr(module, node.id, None)
    if isinstance(node, ast.Attribute):
        owner = _resolve(node.value, module)
        return getattr(owner, node.attr, None) if owner is not None else None
    return None


def call_site_arguments(cls: type) -> dict[str, Any]:
    """The classes (and literal arguments, e.g. ``trainer_defaults``) the module of ``cls`` calls it with
    (``MyCLI(MyModel, MyData)`` in its ``main()``): one call site with a LightningModule class, else none."""
    module = sys.modules.get(cls.__module__)
    try:
        tree = ast.parse(inspect.getsource(module))  # type: ignore[arg-type]
    except (OSError, TypeError, SyntaxError):
        return {}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = (
            func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        )
        if name != cls.__name__:
            continue
        given = dict(zip(("model_class", "datamodule_class"), node.args, strict=False))
        given.update({kw.arg: kw.value for kw in node.keywords if kw.arg in OWNED[-2:]})
        classes = {key: _resolve(value, module) for key, value in given.items()}
        if not _is_class(classes.get("model_class"), LightningModule):
            continue
        if classes.get("datamodule_class") is not None and not _is_class(
            classes["datamodule_class"], LightningDataModule
        ):
            continue
        literals = {}
        for kw in node.keywords:
            if kw.arg is not None and kw.arg not in OWNED:
                with contextlib.suppress(ValueError):
                    literals[kw.arg] = ast.literal_eval(kw.value)
        found.append({**literals, **{k: v for k, v in classes.items() if v is not None}})
    return found[0] if len(found) == 1 else {}


def resolve_cli(target: str | None) -> tuple[type[LightningCLI], dict[str, Any], bool]:
    """The CLI class, its arguments, and whether it is a LightningCLI subclass whose classes were not found."""
    if target is None:
        return TrialCLI, {"subclass_mode_model": True, "subclass_mode_data": True}, False
    module_name, _, attribute = target.partition(":")
    found: Any = getattr(importlib.import_module(module_name), attribute)
    if not isinstance(found, type) and callable(found):
        found = found()
    if _is_class(found, LightningCLI):
        # the user's CLI with the trial's argument (ckpt_path of a saved config) added in front of it
        cli_class = type(f"Trial{found.__name__}", (_AcceptsCkptPath, found), {})
        arguments = call_site_arguments(found)
        return cli_class, arguments, not arguments
    classes = found if isinstance(found, tuple) else (found, None)
    if (
        len(classes) != 2
        or not _is_class(classes[0], LightningModule)
        or not (classes[1] is None or _is_class(classes[1], LightningDataModule))
    ):
        raise TypeError(
            f"--cli {target}: expected a LightningCLI subclass, a LightningModule class or (model class, "
            f"datamodule class), got {found!r:.120}"
        )
    return TrialCLI, {"model_class": classes[0], "datamodule_class": classes[1]}, False


def command_form(target: str, args: list[str]) -> str:
    """``lightning-perf tune -- python main.py fit --config CFG.yaml``: the script of ``target`` run as it runs."""
    module = sys.modules.get(target.partition(":")[0])
    path = getattr(module, "__file__", None) or "train.py"
    script = os.path.relpath(path) if not os.path.relpath(path).startswith("..") else path
    configs = [arg for i, arg in enumerate(args) if i and args[i - 1] == "--config"]
    configs += [arg.split("=", 1)[1] for arg in args if arg.startswith("--config=")]
    tail = " ".join(f"--config {shlex.quote(c)}" for c in configs) or "--config CFG.yaml"
    return f"lightning-perf tune -- python {shlex.quote(script)} fit {tail}"


def build(args: list[str]) -> LightningCLI:
    target = None
    if args and args[0].startswith(CLI_FLAG + "="):
        target = args.pop(0).split("=", 1)[1]
    cli_class, arguments, unknown = resolve_cli(target)
    try:
        return cli_class(
            **{"seed_everything_default": TRIAL_SEED, **arguments},
            args=args,
            run=False,
            save_config_callback=None,
            parser_kwargs={"exit_on_error": False},  # a bad override raises, so it is reported as the error
        )
    except (Exception, SystemExit) as err:
        if target is not None and unknown:  # a subclass given its classes where the script calls it
            name = target.partition(":")[2]
            raise ValueError(
                f"--cli {target}: {name} is given its classes where your script calls it, and no call "
                f"{name}(MyModel, MyData) was found in its module; run it as your script does: "
                f"`{command_form(target, args)}` ({describe_error(err)})"
            ) from err
        raise


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        cli = build(args)
    except (Exception, SystemExit) as err:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        print(protocol_line("error", describe_error(err)), flush=True)
        return 1
    if cli.config.get("ckpt_path"):
        log.info("lightning-perf trial: ignoring ckpt_path %s", cli.config["ckpt_path"])
    # in a round the fit ends the process when it returns (inject), having reported the round
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return 0


if __name__ == "__main__":
    sys.exit(main())
