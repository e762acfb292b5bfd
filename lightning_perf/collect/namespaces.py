"""Lightning's two namespaces: ``lightning.pytorch`` and the standalone ``pytorch_lightning`` package.

Both ship the same classes under different module names, so ``isinstance(logger, TensorBoardLogger)`` with one
namespace's class is False for the other's objects. Every type check of ours goes through :func:`is_instance`,
which tries the class from each namespace that is already imported: an object of a namespace nobody imported
cannot exist, so nothing is imported just to check.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any

# the unified package first: it is a hard dependency of lightning-perf
NAMESPACES = ("lightning.pytorch", "pytorch_lightning")


def loaded_types(module: str, name: str) -> tuple[type, ...]:
    """``<namespace>.<module>.<name>`` for every namespace already imported (e.g. "loggers", "TensorBoardLogger")."""
    found: list[type] = []
    for namespace in NAMESPACES:
        if namespace not in sys.modules:
            continue
        try:
            found.append(getattr(importlib.import_module(f"{namespace}.{module}"), name))
        except (ImportError, AttributeError):  # a version without it: nothing of that kind to match
            continue
    return tuple(found)


def is_instance(obj: Any, module: str, name: str) -> bool:
    """``isinstance(obj, <module>.<name>)`` under either namespace."""
    types = loaded_types(module, name)
    return bool(types) and isinstance(obj, types)


def callback_bases() -> tuple[type, ...]:
    """The base classes of PerfCallback: ``lightning.pytorch.Callback``, and ``pytorch_lightning.Callback`` where
    that package is installed, so the callback is an instance of both (their hooks are the same)."""
    from lightning.pytorch import Callback

    bases: list[type] = [Callback]
    if importlib.util.find_spec("pytorch_lightning") is None:
        return tuple(bases)
    import lightning_utilities.core.rank_zero as rank_zero

    # importing pytorch_lightning points the rank-zero messages of *both* namespaces at its own logger; a user
    # of `lightning` who did not import it keeps Lightning's messages on the logger they configured
    user_logger = None if "pytorch_lightning" in sys.modules else rank_zero.log
    try:
        import pytorch_lightning

        bases.append(pytorch_lightning.Callback)
    except Exception:  # a broken or mismatched install: the unified namespace still works
        pass
    if user_logger is not None:
        rank_zero.log = user_logger
    return tuple(bases)


def trainer_namespace(trainer: Any) -> str:
    """ "pytorch_lightning" for that package's Trainer, else "lightning.pytorch"."""
    return "pytorch_lightning" if type(trainer).__module__.startswith("pytorch_lightning") else NAMESPACES[0]


def lightning_version(trainer: Any) -> str:
    """The version of the Lightning package that runs ``trainer``."""
    package = "pytorch_lightning" if trainer_namespace(trainer) == "pytorch_lightning" else "lightning"
    return str(getattr(importlib.import_module(package), "__version__", "unknown"))
