"""A round's settings applied at run time inside the user's own training command (``tune/trial -- COMMAND``).

:func:`install` runs from the bootstrap ``sitecustomize`` (:mod:`lightning_perf.trial.project.command`) when the round's
spec is in the environment. It imports nothing itself: it waits for the modules to be imported by the command,
then wraps

* ``DataLoader.__init__``: where in the user's code each DataLoader is built (file and line);
* ``Trainer.__init__``: the trial's Trainer settings (its steps and logger, no validation, no checkpoints) and the
  candidate's (``precision``, ``benchmark``) over the command's own; a PerfCallback when it has none; progress;
* Lightning's ``_DataConnector._prepare_dataloader`` for the training loader(s): the candidate's DataLoader
  settings, the loader re-created from the arguments it was built with, as Lightning re-creates one to inject a
  sampler (``_update_dataloader``);
* ``Trainer.fit``: the candidate's compute settings on the model it is given (``matmul_precision``, ``compile``,
  ``channels_last``, ``fused_optimizer``: :mod:`lightning_perf.trial.compute.apply`); when it returns, the facts
  tune needs to name the winner in the project's terms (:mod:`lightning_perf.trial.project.facts`), ``done``, and
  the process ends (what the script does after the fit is no part of the measurement);
* ``LightningCLI.instantiate_classes``: the CLI's parsed config and classes.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import json
import os
import sys
import traceback
from collections.abc import Callable
from types import FrameType
from typing import Any

from lightning_perf.trial.project.command import LOADER_SETTINGS, RUN_ENV, TRAINER_SETTINGS
from lightning_perf.trial.runner import protocol_line

# Lightning's namespaces: the unified package's and the standalone one's (both may be patched in one process)
NAMESPACES = ("lightning.pytorch", "pytorch_lightning")


class Round:
    """The round's spec and what the command built, filled in by the wrappers."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.settings: dict[str, Any] = dict(spec.get("settings") or {})
        self.loaders: list[dict[str, Any]] = []
        self.trainer_site: str | None = None
        self.fit_site: str | None = None
        self.trainer_kwargs: dict[str, Any] = {}
        self.cli: Any = None  # (parsed config, model, datamodule) of a LightningCLI
        self.perf: Any = None

    def say(self, kind: str, text: str = "") -> None:
        print(protocol_line(kind, text), flush=True)


ROUND: Round | None = None


def install() -> None:
    """Read the round's spec from the environment and wait for the modules to wrap; nothing without a spec."""
    global ROUND
    text = os.environ.get(RUN_ENV)
    if not text or ROUND is not None:
        return
    from lightning_perf.trial.parent_death import die_with_parent

    die_with_parent()
    ROUND = Round(json.loads(text))
    hooks: dict[str, Callable[[Any], None]] = {"torch.utils.data.dataloader": _wrap_dataloader}
    for namespace in NAMESPACES:
        hooks[namespace] = _wrap_lightning
        hooks[f"{namespace}.cli"] = _wrap_cli
    for name, hook in hooks.items():  # already imported (a sitecustomize before ours): wrap now
        if name in sys.modules:
            hook(sys.modules[name])
    sys.meta_path.insert(0, _AfterImport({n: h for n, h in hooks.items() if n not in sys.modules}))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``hooks[name](module)`` right after the module ``name`` is imported (once)."""

    def __init__(self, hooks: dict[str, Callable[[Any], None]]) -> None:
        self.hooks = hooks

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        hook = self.hooks.pop(fullname, None)
        if hook is None:
            return None
        spec = importlib.util.find_spec(
            fullname
        )  # the other finders' answer (this one has let go of the name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        execute = loader.exec_module

        def exec_module(module: Any) -> None:
            execute(module)
            hook(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


# ------------------------------------------------------------------------------------------- where it was built


@functools.cache
def _library_dirs() -> tuple[str, ...]:
    """Folders of the libraries between the user's code and a constructor: their frames are skipped."""
    dirs = []
    for name in (
        "torch",
        "lightning",
        "pytorch_lightning",
        "lightning_fabric",
        "lightning_utilities",
        "lightning_perf",
        "hydra",
        "omegaconf",
        "jsonargparse",
    ):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for location in (spec.submodule_search_locations or []) if spec else []:
            dirs.append(os.path.join(os.path.abspath(location), ""))
    return tuple(dirs)


def call_site(obj: Any) -> str | None:
    """``file:line`` of the user's code that built ``obj``: the first frame outside the libraries and outside
    ``obj``'s own ``__init__`` chain (a DataLoader subclass calling ``super().__init__``)."""
    frame: FrameType | None = sys._getframe(1)
    skip = _library_dirs()
    while frame is not None:
        code = frame.f_code
        filename = os.path.abspath(code.co_filename) if not code.co_filename.startswith("<") else ""
        own_init = code.co_name == "__init__" and frame.f_locals.get("self") is obj
        if filename and not filename.startswith(skip) and not own_init:
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return None


SITE_ATTRIBUTE = "_lightning_perf_site"


def _wrap_dataloader(module: Any) -> None:
    cls = module.DataLoader
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if SITE_ATTRIBUTE not in self.__dict__:  # the outermost constructor of the chain
            self.__dict__[SITE_ATTRIBUTE] = call_site(self)

    cls.__init__ = __init__


# ------------------------------------------------------------------------------------------------ the Trainer


def _wrap_lightning(module: Any) -> None:
    from lightning_perf.trial.project.inject_loader import wrap_prepare_dataloader

    trainer_cls = module.Trainer
    init, fit = trainer_cls.__init__, trainer_cls.fit
    logger_cls = importlib.import_module(f"{module.__name__}.loggers").TensorBoardLogger

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        run = ROUND
        assert run is not None
        run.trainer_site = run.trainer_site or call_site(self)
        run.trainer_kwargs = {k: v for k, v in kwargs.items() if k in TRAINER_SETTINGS}
        init(self, *args, **{**kwargs, **_trainer_overrides(run, logger_cls)})
        _prepare(run, self)

    @functools.wraps(fit)
    def fit_then_end(self: Any, *args: Any, **kwargs: Any) -> None:
        from lightning_perf.trial.compute.apply import fit_arguments

        run = ROUND
        assert run is not None
        run.fit_site = run.fit_site or call_site(self)
        args, kwargs = fit_arguments(run.settings, args, kwargs)  # the compute settings, on the model
        _fit_and_end(run, self, lambda: fit(self, *args, **kwargs))

    trainer_cls.__init__ = __init__
    trainer_cls.fit = fit_then_end
    wrap_prepare_dataloader(module, ROUND)


def _trainer_overrides(run: Round, logger_cls: type) -> dict[str, Any]:
    from lightning_perf.trial.worker import TRIAL_TRAINER_DEFAULTS

    spec = run.spec
    logger = logger_cls(save_dir=spec["log_dir"], name=spec["experiment"], version=spec["version"])
    owned = {
        **TRIAL_TRAINER_DEFAULTS,
        "max_steps": int(spec["steps"]),
        "logger": logger,
        "fast_dev_run": False,  # the round's steps, not a debug run's one batch
        "max_time": None,
        "limit_train_batches": None,
    }
    return {**owned, **{k: v for k, v in run.settings.items() if k in TRAINER_SETTINGS}}


def _prepare(run: Round, trainer: Any) -> None:
    from lightning_perf.callback import PerfCallback
    from lightning_perf.trial.worker import prepare_trainer

    own = any(isinstance(cb, PerfCallback) for cb in trainer.callbacks)  # the user's arguments win
    steps = int(run.spec["steps"])
    run.perf = prepare_trainer(
        trainer,
        steps,
        lambda done, total: run.say("progress", f"{done} {total}"),
        None if own else run.spec.get("perf_kwargs"),
        lambda done, total: run.say("pace", f"{done} {total}"),
    )


def _fit_and_end(run: Round, trainer: Any, fit: Callable[[], None]) -> None:
    """Fit, then report the round (``done`` or ``error``) and end the process: rank 0 speaks for the run."""
    from lightning_perf.analysis.summary import RunSummary
    from lightning_perf.trial.project.facts import write_facts
    from lightning_perf.trial.runner import describe_error, disturbance
    from lightning_perf.trial.worker import finish_run

    speaks = getattr(trainer, "global_rank", 0) == 0
    try:
        fit()
        run_dir = os.path.join(run.spec["log_dir"], run.spec["experiment"], run.spec["version"])
        path = finish_run(run.perf, run_dir)
        if speaks and run.spec.get("facts_path"):
            write_facts(run.spec["facts_path"], run, trainer)
    except BaseException as err:
        traceback.print_exc()
        sys.stderr.flush()
        if speaks:
            run.say("error", describe_error(err))
        os._exit(1)
    if speaks:
        try:
            disturbed = disturbance(RunSummary.load(path))
        except Exception:
            disturbed = None
        if disturbed:
            run.say("disturbed", disturbed)
        run.say("done")
    sys.stderr.flush()
    os._exit(0)


def _wrap_cli(module: Any) -> None:
    cli_cls = module.LightningCLI
    original = cli_cls.instantiate_classes

    @functools.wraps(original)
    def instantiate_classes(self: Any) -> None:
        original(self)
        subcommand = getattr(self, "subcommand", None)
        config = self.config.get(subcommand) if subcommand else self.config
        if ROUND is not None:
            ROUND.cli = (config, getattr(self, "model", None), getattr(self, "datamodule", None))

    cli_cls.instantiate_classes = instantiate_classes


__all__ = ["LOADER_SETTINGS", "call_site", "install"]
