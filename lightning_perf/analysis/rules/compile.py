"""Diagnosis rules about ``torch.compile``: recompilations and graph breaks (the summary's ``compile`` part).

Each rule is ``(summary, verdict) -> Finding | None``: silent when the run compiled nothing. The guard texts are
dynamo's own (``tensor 'x' size mismatch at index 0. expected 4, actual 5``); they are read here, in pure code,
to name the cause and its fix.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from lightning_perf.analysis.compile_summary import CompileEvent, CompileSummary
from lightning_perf.analysis.numbers import fmt1 as _fmt
from lightning_perf.analysis.rules.helpers import share_pct
from lightning_perf.analysis.rules.thresholds import (
    COMPILE_SHARE_PCT,
    GRAPH_SPLIT_MEDIUM,
    RECOMPILES_MEDIUM,
)
from lightning_perf.analysis.summary import Finding, RunSummary

_SIZE = re.compile(r"tensor '([^']+)' size mismatch at index (\d+)\. expected (\d+), actual (\d+)")
_INT_ATTRIBUTE = re.compile(r"(self(?:\.\w+)+) == -?\d+")
# guards on the mode the code runs in: train/eval, grad mode, Lightning's own trainer state (self.log and
# friends): each mode compiles once, a warm-up cost and no fault of the model
_MODE_WORDS = (
    "_trainer",
    ".training",
    "grad_mode",
    "GLOBAL_STATE",
    "___check_global_state",
    "is_grad_enabled",
)
# a graph break inside Lightning itself: self.log is wrapped in torch.compiler.disable (every compiled step
# that logs breaks there)
_LIGHTNING_BREAKS = ("_ResultCollection", "lightning")


@dataclass
class Cause:
    """What one recompile's guard says, in the rule's terms."""

    kind: str  # "size", "int_attribute", "mode", "lightning" (a guard in Lightning's own code) or "other"
    text: str  # the guard, without dynamo's "0/3: " prefix
    tensor: str | None = None
    dim: int | None = None
    expected: int | None = None
    actual: int | None = None


def cause_of(reason: str) -> Cause:
    text = re.sub(r"^\d+/\d+: ", "", reason.strip())
    size = _SIZE.search(text)
    if size:
        tensor, dim, expected, actual = size.groups()
        return Cause("size", size.group(0), tensor, int(dim), int(expected), int(actual))
    if any(word in text for word in _MODE_WORDS):
        return Cause("mode", text)
    attribute = _INT_ATTRIBUTE.search(text)
    if attribute or "integer attributes of the nn.Module" in text:
        return Cause("int_attribute", text, tensor=attribute.group(1) if attribute else None)
    return Cause("other", text)


# recompiles the model's code cannot avoid: a new mode compiles once; Lightning's own code is not the model's
_UNAVOIDABLE = ("mode", "lightning")
_LIGHTNING_LOGGING_FIX = (
    "Upgrade to `lightning>=2.5`, which keeps `self.log` out of the compiled graph, or compile the network rather "
    "than the LightningModule (`self.net = torch.compile(self.net)`), so that logging runs eagerly."
)


def _cause_of_event(event: CompileEvent) -> Cause:
    cause = cause_of(event.recompile_reason or "")
    if event.in_lightning and cause.kind != "mode":
        return Cause("lightning", cause.text)
    return cause


def _last_of_epoch(event: CompileEvent, per_epoch: Any) -> bool | None:
    if not isinstance(per_epoch, int) or per_epoch <= 0:
        return None
    return (event.step + 1) % per_epoch == 0


def _fix(causes: list[Cause], events: list[CompileEvent], summary: RunSummary) -> tuple[str, str, dict]:
    """(what varies, the fix, its settings change) for the commonest cause."""
    main = Counter(c.kind for c in causes).most_common(1)[0][0]
    picked = [c for c in causes if c.kind == main]
    if main == "size":
        dims = Counter((c.tensor, c.dim) for c in picked)
        (tensor, dim), _ = dims.most_common(1)[0]
        sizes = sorted({v for c in picked for v in (c.actual, c.expected) if v is not None})
        smaller = {c.actual for c in picked if c.actual is not None and c.expected and c.actual < c.expected}
        in_train = [e for e, c in zip(events, causes, strict=True) if c.kind == "size" and e.stage == "train"]
        at_end = [_last_of_epoch(e, summary.settings.train_batches_per_epoch) for e in in_train]
        if (
            dim == 0
            and len(smaller) == 1
            and len(sizes) == 2
            and in_train
            and all(x is not False for x in at_end)
        ):
            return (
                f"the last batch of the epoch is shorter ({min(smaller)} samples, not {max(sizes)}): "
                f"`{tensor}` changes size in dimension 0",
                "Drop the short last batch (`DataLoader(..., drop_last=True)`), or pad it to the full batch size.",
                {"drop_last": True},
            )
        shown = ", ".join(str(s) for s in sizes[:8]) + (", ..." if len(sizes) > 8 else "")
        if dim == 0:
            return (
                f"the batch size varies (`{tensor}` dimension 0 took sizes {shown})",
                "Compile for a varying size: `torch.compile(model, dynamic=True)`, or mark that dimension before "
                f"the call (`torch._dynamo.mark_dynamic({tensor}, 0)`); or keep the batch size fixed.",
                {"dynamic": True},
            )
        return (
            f"dimension {dim} of `{tensor}` varies (sizes {shown}), e.g. a sequence length",
            f"Pad to a few fixed lengths (bucketing), or mark the dimension dynamic "
            f"(`torch._dynamo.mark_dynamic({tensor}, {dim})`, or `torch.compile(model, dynamic=True)`).",
            {"dynamic": True},
        )
    if main == "int_attribute":
        name = picked[0].tensor or "an integer attribute"
        return (
            f"`{name}` is a Python int on the module that changes between steps (dynamo treats module ints as "
            "constants)",
            f"Keep `{name}` out of the compiled code or make it a tensor (or set "
            "`torch._dynamo.config.allow_unspec_int_on_nn_module = True`).",
            {},
        )
    return (
        f"a guard failed: `{picked[0].text}`",
        "Keep that value constant between calls, or mark what varies dynamic (`torch.compile(dynamic=True)`); "
        'run with `TORCH_LOGS="recompiles"` for every guard.',
        {},
    )


def recompilation(summary: RunSummary, verdict: str | None) -> Finding | None:
    """Recompiles beyond warm-up (a guard on something that keeps changing), or recompiles costing a large share
    of the training time."""
    comp: CompileSummary | None = summary.compile
    if comp is None or not comp.recompiles and not comp.recompile_limit_hit:
        return None
    events = [e for e in comp.events if e.recompile_reason and e.failure is None]
    causes = [_cause_of_event(e) for e in events]
    avoidable = [(e, c) for e, c in zip(events, causes, strict=True) if c.kind not in _UNAVOIDABLE]
    recompile_s = sum(e.duration_s for e in events)
    share = share_pct(recompile_s, summary.timing.train_wall_s)
    costly = share is not None and share >= COMPILE_SHARE_PCT
    if not avoidable and not costly and not comp.recompile_limit_hit:
        return None
    if avoidable:
        what, fix, change = _fix([c for _, c in avoidable], [e for e, _ in avoidable], summary)
    elif any(c.kind == "lightning" for c in causes):  # Lightning < 2.5 traces self.log into the step
        what = (
            "guards in Lightning's own logging code (this Lightning lets torch.compile trace `self.log`) and mode "
            "switches (training/evaluation)"
        )
        fix, change = _LIGHTNING_LOGGING_FIX, {}
    else:  # only mode switches (train/eval, Lightning's logging): each compiles once per process
        what = "the code switches modes (training/evaluation, Lightning's trainer state); each mode compiles once"
        fix = (
            "A one-time cost per process: compile what runs most (e.g. only the model's `forward`), or "
            "skip the sanity check (`num_sanity_val_steps=0`) so evaluation is compiled only when it runs."
        )
        change = {}
    first = (avoidable[0] if avoidable else (events[0], causes[0])) if events else None
    evidence = (
        f"{comp.recompiles} of {comp.compiles} compilations were recompiles "
        f"({len(avoidable)} after warm-up), {_fmt(recompile_s)} s"
        + (f", {_fmt(share)}% of the training time" if share is not None else "")
        + f"; compiling took {_fmt(comp.total_s)} s in all. Cause: {what}"
    )
    if first is not None:
        evidence += f" (first at step {first[0].step}: `{first[1].text}`)"
    evidence += "."
    if comp.recompile_limit_hit:
        evidence += (
            " Dynamo hit its recompile limit (`torch._dynamo.config.recompile_limit`): the function then runs "
            "without compiling."
        )
    many = len(avoidable) >= RECOMPILES_MEDIUM
    # recompiles of mode switches alone are a one-time cost the model cannot avoid: low however large their share
    severity = "high" if comp.recompile_limit_hit or (costly and avoidable) else "medium" if many else "low"
    return Finding(
        id="recompilation",
        severity=severity,
        title="torch.compile recompiles: " + what.split(" (")[0].split(":")[0],
        evidence=evidence,
        recommendation=fix,
        settings_change=change,
    )


_RESUME = re.compile(r"torch_dynamo_resume_in_(\w+?)_at_(\d+)$")


def describe_site(site: str) -> str:
    """``torch_dynamo_resume_in_forward_at_12`` -> ``forward, line 12``."""
    match = _RESUME.match(site)
    return f"{match.group(1)}, line {match.group(2)}" if match else site


def sites_text(sites: dict[str, int], limit: int = 3) -> str:
    """Where traced code resumed after breaks, most frequent first: ``forward, line 12 (4x); ...``."""
    return "; ".join(f"{describe_site(site)} ({n}x)" for site, n in list(sites.items())[:limit])


def _lightning_break(reason: str) -> bool:
    return any(word in reason for word in _LIGHTNING_BREAKS)


def graph_breaks(summary: RunSummary, verdict: str | None) -> Finding | None:
    """A compiled model split into several graphs by code dynamo cannot trace (print, .item(), data-dependent
    Python control flow, ...): each break ends a graph, runs Python in between and resumes in a new one."""
    comp = summary.compile
    if comp is None or not comp.graph_breaks:
        return None
    own = {r: n for r, n in comp.break_reasons.items() if not _lightning_break(r)}
    if not own:
        return None  # only Lightning's self.log (torch.compiler.disable): by design, nothing for the model to fix
    if comp.lightning_sites:  # breaks for other reasons inside Lightning's code: its logging was traced
        return _breaks_in_lightning(comp)
    reasons = "; ".join(f"`{r}` ({n}x)" for r, n in list(own.items())[:3])
    where = sites_text(comp.break_sites)
    graphs = comp.graphs or 0
    evidence = (
        f"{comp.graph_breaks} graph break(s) split the compiled code into {graphs} graphs"
        + (f", resumed at {where}" if where else "")
        + f". torch's reasons: {reasons}."
    )
    if len(own) < len(comp.break_reasons):
        evidence += " Lightning's own `self.log` breaks too (by design; not counted as a fault)."
    return Finding(
        id="graph_breaks",
        severity="medium" if graphs >= GRAPH_SPLIT_MEDIUM else "low",
        title="torch.compile graph breaks: the model runs as several graphs",
        evidence=evidence,
        recommendation=(
            "Remove what breaks the graph from the compiled code (printing, `.item()`/`.tolist()`, Python branches "
            "on tensor values) or move it out of `forward`; `torch.compile(model, fullgraph=True)` turns every "
            "break into an error that shows where it is."
        ),
    )


def _breaks_in_lightning(comp: CompileSummary) -> Finding:
    """Breaks inside Lightning's own code: a Lightning (< 2.5) that lets dynamo trace ``self.log``. The model's
    code is not at fault; where it calls ``self.log`` it breaks too."""
    sites = [describe_site(site) for site in comp.lightning_sites]
    shown = "; ".join(sites[:3]) + (f" and {len(sites) - 3} more" if len(sites) > 3 else "")
    return Finding(
        id="graph_breaks",
        severity="low",
        title="torch.compile graph breaks in Lightning's own logging",
        evidence=(
            f"{comp.graph_breaks} graph break(s) split the compiled code into {comp.graphs or 0} graphs; "
            f"{len(sites)} of the {len(comp.break_sites)} places where tracing resumed lie in Lightning's code "
            f"({shown}): this Lightning traces `self.log` into the compiled step."
        ),
        recommendation=_LIGHTNING_LOGGING_FIX,
    )
