"""Building a summary's dataclasses from its decoded JSON, with errors that name the field.

A hand-edited, truncated or corrupt ``perf_summary.json`` can parse yet miss fields or hold a string where a
number belongs. The error then says where and what, in the summary's own terms
(``timing.step_time_ms: missing count, mean, median``; ``timing.steps: expected a whole number, got '3'``), never
a Python class or an ``__init__()`` message. Fields a newer release added are ignored, not fatal.

Hand-written rather than ``msgspec.convert``: msgspec stops at the first missing field of an object (the user
would fix one field per run) and names the dataclass's types in Python's terms. Pure: no torch, no Lightning.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from typing import Any

from lightning_perf.analysis.numbers import is_number

# what each JSON-level kind is called in an error
_KINDS = {dict: "an object", list: "a list", type(None): "null"}


class FieldError(ValueError):
    """One field of a summary is missing or of the wrong kind; the message starts with the field's path."""


def build(cls: type, data: Any, where: str = "") -> Any:
    """Dataclass ``cls`` from the dict ``data`` (``where``: its path in the summary, "" at the top)."""
    if not isinstance(data, dict):
        raise FieldError(f"{where or 'the summary'}: expected an object, got {_kind(data)}")
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    missing = [
        f.name
        for f in fields
        if f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
        and f.name not in data
    ]
    if missing:
        raise FieldError(f"{where or 'the summary'}: missing {', '.join(missing)}")
    known = {f.name for f in fields}
    return cls(
        **{
            name: convert(hints[name], value, _join(where, name))
            for name, value in data.items()
            if name in known
        }
    )


def convert(hint: Any, value: Any, where: str) -> Any:
    """``value`` as the type ``hint`` describes (nested dataclasses built), or :class:`FieldError` naming ``where``."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if value is None:
            return None
        if len(inner) == 1:
            return convert(inner[0], value, where)
        if all(arg in (int, float) for arg in inner):  # e.g. val_check_interval: a fraction or a batch count
            return _number(float, value, where)
        return value
    if value is None:
        if dataclasses.is_dataclass(hint):
            raise FieldError(f"{where}: expected an object, got null")
        if hint in (int, float):
            raise FieldError(f"{where}: expected a number, got null")
        return None
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return build(hint, value, where)
    if hint in (int, float):
        return _number(hint, value, where)
    if hint is str and not isinstance(value, str):
        raise FieldError(f"{where}: expected a string, got {_kind(value)}")
    if hint is bool and not isinstance(value, bool):
        raise FieldError(f"{where}: expected true or false, got {_kind(value)}")
    if origin is list:
        if not isinstance(value, list):
            raise FieldError(f"{where}: expected a list, got {_kind(value)}")
        (item_hint,) = typing.get_args(hint)
        if item_hint in (int, float) and _plain_numbers(value, whole=item_hint is int):
            return list(value)
        return [convert(item_hint, item, f"{where}[{i}]") for i, item in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise FieldError(f"{where}: expected an object, got {_kind(value)}")
        _, item_hint = typing.get_args(hint)
        return {key: convert(item_hint, item, _join(where, str(key))) for key, item in value.items()}
    return value


def _plain_numbers(values: list[Any], whole: bool) -> bool:
    """Whether every item is an int (or, unless ``whole``, a float), as JSON decodes them: one pass, where a
    :func:`convert` an item costs seconds for a hand-made summary of a million samples."""
    if whole:
        return all(type(v) is int for v in values)
    return all(type(v) is float or type(v) is int for v in values)


def suspects(values: list[Any], measured: bool) -> list[int]:
    """The indices of the items of a decoded list that are not plain finite numbers (nor >= 0 when
    ``measured``): the only ones a check item by item needs to look at (containers, strings, NaN, ...)."""
    low, high = (0, sys.float_info.max) if measured else (-sys.float_info.max, sys.float_info.max)
    return [
        i for i, v in enumerate(values) if not ((type(v) is float or type(v) is int) and low <= v <= high)
    ]


def _number(hint: type, value: Any, where: str) -> Any:
    if not is_number(value):
        wanted = "a whole number" if hint is int else "a number"
        raise FieldError(f"{where}: expected {wanted}, got {_kind(value)}")
    if hint is int and not isinstance(value, int):
        raise FieldError(f"{where}: expected a whole number, got {value!r}")
    return value


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    return _KINDS.get(type(value), repr(value))


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name
