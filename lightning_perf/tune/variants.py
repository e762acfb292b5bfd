"""A ``--variant NAME[:key=value[,key=value...]]`` of ``trial`` and ``tune``, read once where it enters into a
:class:`VariantArg` (:func:`parse_variant`), used as that everywhere after.

What a key may name depends on the project (a command takes tune's setting names only, a config its keys too):
that is checked by the project's ``preflight`` (:mod:`lightning_perf.tune.project`), on the value read here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from lightning_perf.trial.spec import KEY_PATTERN, TrialError, check_name
from lightning_perf.yaml_budget import YamlBudgetError, load_yaml

FLAG = "--variant"
USAGE = "expected NAME or NAME:key=value[,key=value...], e.g. workers4:data.init_args.num_workers=4"
# "a=1,b.c=[1,2]" splits only at commas followed by "key=", so values may hold commas (lists, dicts)
OVERRIDE_SPLIT = re.compile(rf",(?={KEY_PATTERN}=)")
# settings the trial owns: the step budget and where each run is logged
RESERVED_KEYS = ("trainer.max_steps", "trainer.logger")


@dataclass
class VariantArg:
    """One variant as given: its name and overrides, ``(key, text)`` in the order given (a config's CLI takes the
    text after the config), and ``values``, each override's text read as YAML once (the text where it is none)."""

    name: str
    overrides: list[tuple[str, str]] = field(default_factory=list)
    values: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.overrides = [(key, text) for key, text in self.overrides]
        self.values = {key: _yaml_value(text) for key, text in self.overrides}

    @property
    def pair(self) -> tuple[str, list[tuple[str, str]]]:
        """``(name, overrides)``: the form the trial stage's API takes (``run_command_trial``)."""
        return self.name, list(self.overrides)

    @property
    def keys(self) -> list[str]:
        return [key for key, _ in self.overrides]


def as_variants(variants: Any) -> list[VariantArg]:
    """The Python API's variants, :class:`VariantArg` or ``(name, overrides)`` pairs, as :class:`VariantArg`."""
    return [v if isinstance(v, VariantArg) else VariantArg(v[0], list(v[1])) for v in variants or []]


def parse_variant(text: str) -> VariantArg:
    """``"workers4:data.init_args.num_workers=4,trainer.benchmark=true"`` -> its name and (key, value) overrides;
    a malformed one, a key the trial sets, a key given twice or a value that is no YAML raise :class:`TrialError`."""
    name, sep, rest = text.partition(":")
    check_name(name, FLAG)
    if not sep:
        return VariantArg(name)
    if not rest:
        raise TrialError(f"{FLAG} {text!r}: no override after ':'; {USAGE}")
    overrides = []
    for item in OVERRIDE_SPLIT.split(rest):
        key, eq, value = item.partition("=")
        if not eq or not re.fullmatch(KEY_PATTERN, key):
            raise TrialError(f"{FLAG} {text!r}: malformed override {item!r}; {USAGE}")
        if any(key == r or key.startswith(r + ".") for r in RESERVED_KEYS):
            raise TrialError(
                f"{FLAG} {text!r}: {key} is set by the trial (--steps and --log-dir/--name); "
                "it cannot be overridden"
            )
        check_override_value(text, key, value)
        overrides.append((key, value))
    keys = [key for key, _ in overrides]
    if len(set(keys)) != len(keys):
        raise TrialError(f"{FLAG} {text!r}: a key is given twice")
    return VariantArg(name, overrides)


def check_override_value(text: str, key: str, value: str) -> None:
    """The Lightning CLI reads an override's value as YAML: one that does not parse fails here, not in a round."""
    import yaml

    try:
        load_yaml(value, f"{FLAG} {text!r}: the value of {key}")
    except YamlBudgetError as err:
        raise TrialError(str(err)) from None
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise TrialError(
            f"{FLAG} {text!r}: the value of {key} ({value!r}) does not parse as YAML: {problem}"
        ) from None


def _yaml_value(text: str) -> Any:
    import yaml

    try:
        return load_yaml(text, f"the value {text!r}")  # within the node budget: parse_variant checked it
    except yaml.YAMLError:  # a pair given to the Python API, never checked: its text, as before
        return text
