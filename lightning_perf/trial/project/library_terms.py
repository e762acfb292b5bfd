"""The winner in the terms of a library that builds the DataLoader (and often the Trainer) for its users.

darts, pytorch-forecasting and neuralforecast build the training DataLoader inside their own code, so the file
and line that built it (``call_site``, seen by the diagnosis round) is the library's, not a line the user edits.
The library is found by that site (a file under ``site-packages/<package>/``) or by the loader's class
(``neuralforecast.tsdataset.TimeSeriesLoader``), and the change is said the way the library takes it:

* darts: ``dataloader_kwargs={"num_workers": 4}`` to the model's ``fit()`` (``num_loader_workers=4`` in the
  darts versions before ``dataloader_kwargs``); its Trainer's settings in the model's ``pl_trainer_kwargs``;
* pytorch-forecasting: ``to_dataloader(num_workers=4)``;
* neuralforecast: the model's ``dataloader_kwargs={"num_workers": 4}``; its Trainer's settings as the model's
  keyword arguments (neuralforecast hands them to the Trainer);
* any other library under ``site-packages``: its name and the line, with the DataLoader's keyword to pass it.

A project that builds its DataLoader itself (lightly's examples do) keeps the plain "the DataLoader built here"
line (:func:`lightning_perf.trial.project.terms._code_lines`). Pure: reads the facts; imports no library.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from lightning_perf.trial.project.command import LOADER_SETTINGS, TRAINER_SETTINGS

_INSTALLED = ("site-packages", "dist-packages")


@dataclass(frozen=True)
class Library:
    name: str  # as people write it
    # how the DataLoader's keywords reach it; {kwargs}: the keywords as a dict, {args}: as arguments
    loader: str
    trainer: str | None = None  # how the Trainer's keywords reach it, where the library builds the Trainer


LIBRARIES = {
    "darts": Library(
        "darts",
        "pass dataloader_kwargs={kwargs} to the model's fit() (darts versions before dataloader_kwargs: "
        "num_loader_workers={workers})",
        "pass pl_trainer_kwargs={kwargs} to the model",
    ),
    "pytorch_forecasting": Library("pytorch-forecasting", "call the dataset's to_dataloader({args})"),
    "neuralforecast": Library(
        "neuralforecast",
        "pass dataloader_kwargs={kwargs} to the model (e.g. MLP(..., dataloader_kwargs=...))",
        "pass {args} to the model (neuralforecast hands them to the Trainer)",
    ),
}


def package_of(site: str | None) -> str | None:
    """The installed package a ``file:line`` lies in (``.../site-packages/darts/...`` -> ``darts``), or None."""
    if not site:
        return None
    parts = os.path.normpath(site.rsplit(":", 1)[0]).split(os.sep)
    for i in range(len(parts) - 2, 0, -1):
        if parts[i - 1] in _INSTALLED:
            return parts[i]
    return None


def _package_of_class(name: str | None) -> str | None:
    top = (name or "").split(".", 1)[0]
    return top if top in LIBRARIES else None


def _python(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _as_kwargs(changes: dict[str, Any]) -> str:
    return "{" + ", ".join(f'"{k}": {_python(v)}' for k, v in changes.items()) + "}"


def _as_args(changes: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_python(v)}" for k, v in changes.items())


def _phrase(template: str, changes: dict[str, Any]) -> str:
    workers = changes.get("num_workers", "N")
    return template.format(kwargs=_as_kwargs(changes), args=_as_args(changes), workers=workers)


def library_lines(facts: dict[str, Any], changes: dict[str, Any]) -> tuple[list[str], dict[str, Any]] | None:
    """The lines for the changes a library takes, and the changes left for the plain code lines; None when the
    training DataLoader was built by the project itself (or was not seen)."""
    loaders = facts.get("loaders") or []
    seen = loaders[0] if loaders else {}
    site = seen.get("site")
    package = _package_of_class(seen.get("class")) or package_of(site)
    if package is None:
        return None
    library = LIBRARIES.get(package)
    name = library.name if library else package
    argv = facts.get("argv") or []
    where = f"{argv[0]}: " if argv and argv[0].endswith(".py") else ""
    built = f" ({site})" if site else ""
    loader = {k: v for k, v in changes.items() if k in LOADER_SETTINGS}
    trainer = {k: v for k, v in changes.items() if k in TRAINER_SETTINGS}
    lines = []
    if loader:
        how = _phrase(library.loader, loader) if library else f"pass it the DataLoader's {_as_args(loader)}"
        lines.append(f"{where}{name} builds the training DataLoader{built}: {how}")
    trainer_by_library = package_of(facts.get("trainer_site")) == package
    if trainer and library and library.trainer and trainer_by_library:
        lines.append(f"{where}{name} builds the Trainer: {_phrase(library.trainer, trainer)}")
    else:
        trainer = {}
    left = {k: v for k, v in changes.items() if k not in loader and k not in trainer}
    return lines, left
