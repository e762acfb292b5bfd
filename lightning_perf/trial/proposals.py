"""From a diagnosis to candidate variants of a Lightning CLI config (``lightning-perf tune``).

Pure: takes the findings of the diagnosis fit, its settings and where the config can set each key (the
``targets``: tune's setting names applied at run time, plus the keys only a config holds, read from its CLI by the
diagnosis, see :func:`lightning_perf.trial.project.command.cli_targets`), and returns

* :class:`Candidate` variants, each a set of config overrides named after its change, plus their combination;
* :class:`Unapplied` changes: those that need code (the batched-transforms recipe where the project has no
  ``batched_transforms`` argument to switch it on, removing ``.item()`` calls),
  those the config cannot reach (a DataLoader built in code with fixed arguments), those a trial cannot measure
  (validation and checkpoint frequency: trials run neither) and semantic changes not asked for.

Each compute setting of a finding (``precision``, ``matmul_precision``, ``compile``, ``channels_last``,
``fused_optimizer``) is a candidate of its own. A change that alters what is learned (the batch size; lower
precision or TF32 matmuls for a run that asked for full precision) is a candidate only with ``allow_semantic`` and
is always labelled so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lightning_perf.analysis.rules.thresholds import FULL_PRECISION, SETTING_TARGETS
from lightning_perf.analysis.summary import Finding, Settings
from lightning_perf.trial.compute.settings import ALONE, COMPUTE_SETTINGS

# the settings a Trainer flag override sets (``trainer.<key>``)
TRAINER_KEYS = ("benchmark", "precision")
# settings a trial cannot measure: its runs do no validation and save no checkpoints
UNMEASURED_KEYS = ("check_val_every_n_epoch", "val_check_interval", "limit_val_batches", "every_n_epochs")
# DataLoader arguments that change what is learned (the optimizer sees other batches)
SEMANTIC_LOADER_KEYS = ("batch_size",)
# findings of these severities with no settings change still ask for work: listed as "needs code"
ACTIONABLE_SEVERITIES = ("high", "medium")
COMBINED = "combined"
# the diagnosis's finding about the machine itself (others holding its cores): not a change of the project
MACHINE_FINDING = "noisy_machine"
SEMANTIC_LABEL = "semantic change: alters what is learned"


@dataclass
class Candidate:
    """One variant to measure: ``overrides`` for the CLI (``key``, value text), ``changes`` for the YAML."""

    name: str  # a directory name (letters, digits, _.-)
    label: str  # how people read it: "num_workers=2 + persistent_workers"
    overrides: list[tuple[str, str]]
    changes: dict[str, Any]  # dotted config key -> value
    semantic: bool = False
    findings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "label": self.label,
            "overrides": dict(self.overrides),
            "semantic": self.semantic,
            "findings": list(self.findings),
        }


@dataclass
class Unapplied:
    """A finding's change tune does not try, and why: ``needs code``, ``not in the config``, ``not measured``,
    ``semantic`` or ``the machine, not the config``."""

    finding: str
    title: str
    reason: str
    recommendation: str
    change: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "finding": self.finding,
            "title": self.title,
            "reason": self.reason,
            "recommendation": self.recommendation,
            "change": dict(self.change),
        }


@dataclass
class Proposal:
    candidates: list[Candidate]
    unapplied: list[Unapplied]


def value_text(value: Any) -> str:
    """A value as the Lightning CLI reads it on the command line (``true``, ``2``, ``bf16-mixed``)."""
    return value if isinstance(value, str) else json.dumps(value)


def label_of(key: str, value: Any) -> str:
    if key == "compile" and value is True:
        return "torch.compile"
    return key if value is True else f"{key}={value}"


def slug(text: str) -> str:
    """A variant name from a label: ``num_workers=2`` -> ``num_workers_2``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_.") or "candidate"


def is_semantic(key: str, value: Any, settings: Settings) -> bool:
    if key in SEMANTIC_LOADER_KEYS:
        return True
    if key == "precision":  # full precision asked for (or the default, None): lower precision changes numbers
        return settings.precision is None or str(settings.precision) in FULL_PRECISION
    if key == "matmul_precision":  # fp32 matmuls asked for: TF32 or bf16 passes change numbers
        return value != "highest" and settings.float32_matmul_precision in (None, "highest")
    return False


def changes_batch_size(key: str, targets: dict[str, Any] | None = None) -> bool:
    """A config override key that sets the batch size: one whose last part is ``batch_size``
    (``data.init_args.batch_size``), or where the diagnosis found the DataLoader's batch size set."""
    if key.rsplit(".", 1)[-1] in SEMANTIC_LOADER_KEYS:
        return True
    return bool(targets) and key == (targets or {}).get("loader_keys", {}).get("batch_size")


def semantic_label(label: str) -> str:
    """``label (semantic change: alters what is learned)``, once."""
    return label if SEMANTIC_LABEL in label else f"{label} ({SEMANTIC_LABEL})"


def config_key(key: str, targets: dict[str, Any]) -> str | None:
    """Where the config sets ``key``: ``trainer.benchmark``, ``data.init_args.num_workers``, or None (a command's
    tune sets the settings by their own names: its targets' ``trainer_keys`` say so)."""
    if key in TRAINER_KEYS:
        return targets.get("trainer_keys", {}).get(key, f"trainer.{key}")
    if key == "compile" and targets.get("compile") and not targets.get("compile_on"):
        return targets["compile"]  # a config's model with a compile argument
    if key in COMPUTE_SETTINGS:  # applied at run time by a command's rounds only
        return targets.get("compute_keys", {}).get(key)
    return targets.get("loader_keys", {}).get(key)


def config_keys(key: str, targets: dict[str, Any]) -> list[str]:
    """Every config key that sets ``key``: one for a setting, the model's and the datamodule's for a recipe the
    project switches on by an argument (``model.init_args.batched_transforms``, ``data.init_args....``)."""
    if SETTING_TARGETS.get(key) == "LightningModule":
        return list(targets.get("recipes", {}).get(key, []))
    where = config_key(key, targets)
    return [] if where is None else [where]


def propose(
    findings: Sequence[Finding],
    settings: Settings,
    targets: dict[str, Any],
    allow_semantic: bool = False,
) -> Proposal:
    """The candidates for the findings (most severe first, one per setting), plus their combination."""
    singles: list[Candidate] = []
    unapplied: list[Unapplied] = []
    taken: set[str] = set()
    for f in findings:
        if not f.settings_change:
            if f.id == MACHINE_FINDING:  # others held the cores: nothing in the config to change
                if f.severity in ACTIONABLE_SEVERITIES:
                    unapplied.append(
                        Unapplied(f.id, f.title, "the machine, not the config", f.recommendation)
                    )
            elif f.severity in ACTIONABLE_SEVERITIES:
                unapplied.append(Unapplied(f.id, f.title, "needs code", f.recommendation))
            continue
        # one candidate a finding: the keys of one settings change go together (`num_workers=4` with the
        # `persistent_workers=True` its text asks for), each key in the first finding that sets it; compute
        # settings (ALONE) one a candidate
        together = {k: v for k, v in f.settings_change.items() if k not in ALONE}
        alone = [{k: v} for k, v in f.settings_change.items() if k in ALONE]
        for change in [together, *alone]:
            single = _candidate(f, change, settings, targets, allow_semantic, taken, unapplied)
            if single is not None:
                singles.append(single)
    compile_key = targets.get("compile")
    if compile_key and not targets.get("compile_on") and "compile" not in taken:
        singles.append(Candidate("compile", "torch.compile", [(compile_key, "true")], {compile_key: True}))
    candidates = list(singles)
    if len(singles) > 1:
        semantic = any(c.semantic for c in singles)
        label = " + ".join(c.label.removesuffix(f" ({SEMANTIC_LABEL})") for c in singles)
        candidates.append(
            Candidate(
                COMBINED,
                label + (f" ({SEMANTIC_LABEL})" if semantic else ""),
                [o for c in singles for o in c.overrides],
                {k: v for c in singles for k, v in c.changes.items()},
                semantic,
                list(dict.fromkeys(i for c in singles for i in c.findings)),  # each finding once
            )
        )
    return Proposal(candidates, unapplied)


def _candidate(
    f: Finding,
    change: dict[str, Any],
    settings: Settings,
    targets: dict[str, Any],
    allow_semantic: bool,
    taken: set[str],
    unapplied: list[Unapplied],
) -> Candidate | None:
    """The candidate of one settings change of ``f`` (the keys not ``taken`` by an earlier finding), or None;
    the keys it cannot try go to ``unapplied``."""
    labels, overrides, changes, semantic = [], [], {}, False
    for key, value in change.items():
        if key in taken:
            continue
        reason = _why_not(key, value, settings, targets, allow_semantic)
        if reason is not None:
            unapplied.append(Unapplied(f.id, f.title, reason, f.recommendation, {key: value}))
            continue
        wheres = config_keys(key, targets)
        assert wheres  # _why_not checked
        taken.add(key)
        labels.append(label_of(key, value))
        semantic = semantic or is_semantic(key, value, settings)
        overrides += [(where, value_text(value)) for where in wheres]
        changes.update({where: value for where in wheres})
    if not labels:
        return None
    label = " + ".join(labels) + (f" ({SEMANTIC_LABEL})" if semantic else "")
    return Candidate(slug(labels[0]), label, overrides, changes, semantic, [f.id])


def _why_not(
    key: str, value: Any, settings: Settings, targets: dict[str, Any], allow_semantic: bool
) -> str | None:
    if SETTING_TARGETS.get(key) == "LightningModule":  # a recipe: tried where the project has its switch
        return None if config_keys(key, targets) else "needs code"
    if key in UNMEASURED_KEYS:
        return "not measured: a trial runs no validation and saves no checkpoints"
    if key in COMPUTE_SETTINGS and config_key(key, targets) is None:
        return "not in the config: applied at run time by tune with your command (lightning-perf tune -- COMMAND)"
    if config_key(key, targets) is None:
        return (
            f"not in the config: the DataLoader's {key} is not an argument of the datamodule or model; "
            "set it where the DataLoader is built"
        )
    if is_semantic(key, value, settings) and not allow_semantic:
        return f"{SEMANTIC_LABEL}; tried only with --allow-semantic-changes"
    return None
