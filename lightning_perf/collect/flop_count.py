"""The FLOPs of one real training step, counted once a fit with ``torch.utils.flop_counter.FlopCounterMode``.

The callback enters the mode at the start of one training batch and leaves it at that batch's end, so forward,
backward and the optimizer are inside; every other batch pays one ``is None`` check in each hook. The counted
batch is the fit's first: it is start-up, not a timed step (the epoch's first fetch), and the default profiling
cycle starts later (``skip_first=5``), so the mode's Python dispatch slows no figure and shows in no trace. A
torch.compile'd model is not counted: under the mode its guards fail and it would recompile. FlopCounterMode counts matmuls, convolutions and attention by formula; elementwise operators, custom
kernels without a formula and anything it never sees count 0 (``not_counted`` says so).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from lightning_perf import console
from lightning_perf.analysis.compute.limit import MAX_MODULES, ModuleFlops, StepFlops

if TYPE_CHECKING:
    from lightning_perf.collect.config import PerfConfig
    from lightning_perf.collect.run_state import PerfSession

log = console.logger(__name__)

# 0-based: the fit's first training batch. It is no step of the figures anyway (the epoch's first fetch is
# start-up, collect.steps.step_clock), so the mode's Python dispatch slows no timed step and no step is lost; where
# the batch hooks time the steps (collect.steps.fetch_timing.HookTiming) it is dropped (batch_ended).
COUNTED_BATCH = 0
_GLOBAL = "Global"  # FlopCounterMode's key for the whole step
COMPILED = (
    "a torch.compile'd model: not counted (under FlopCounterMode its guards fail and it would recompile); "
    "flops_per_batch= gives its MFU"
)


def start(config: PerfConfig, session: PerfSession, module: torch.nn.Module) -> FlopCount | None:
    """At the start of a fit: the counter of one step, or None when the user gave ``flops_per_batch``."""
    if config.flops_per_batch is not None:
        session.flops = StepFlops(config.flops_per_batch, source="user")
        return None
    if _compiled(module):
        # under a dispatch mode dynamo guards fail and the model recompiles: not counted, and said so
        log.info(
            "lightning-perf: a torch.compile'd model's FLOPs are not counted (counting would recompile it); "
            "pass `PerfCallback(flops_per_batch=...)` for its MFU."
        )
        session.flops = StepFlops(0.0, batch=None, not_counted=[COMPILED])
        return None
    return FlopCount(module, session)


def abandon(counter: FlopCount | None) -> None:
    """The fit ended: a count still under way is dropped (its mode left). None, for the callback to keep."""
    if counter is not None:
        counter.abandon()


class FlopCount:
    """Counts the FLOPs of training batch ``batch`` of ``module``'s fit into ``session.flops``."""

    def __init__(self, module: torch.nn.Module, session: PerfSession, batch: int = COUNTED_BATCH) -> None:
        self._module = module
        self._session = session
        self._batch = batch
        self._started = 0
        self._mode: FlopCounterMode | None = None
        self._calls: Counter[str] = Counter()

    def batch_started(self) -> None:
        started = self._started
        self._started = started + 1
        if started == self._batch:
            mapping = {op: _counting(op, formula, self._calls) for op, formula in flop_registry.items()}
            mode = FlopCounterMode(display=False, custom_mapping=mapping)
            try:
                mode.__enter__()
            except Exception as err:  # never fail the fit over a count
                log.warning(f"lightning-perf: could not count the step's FLOPs: {err}")
                return
            self._mode = mode

    def batch_ended(self) -> bool:
        """Leave the mode after the counted batch; True once counting is over (the callback then drops us)."""
        mode, self._mode = self._mode, None
        if mode is None:
            return False
        mode.__exit__(None, None, None)
        # the mode's Python dispatch slowed the batch: no step of the figures, nor of the anatomy (already none
        # where it is the epoch's first fetch; a step where the batch hooks time the steps)
        self._session.clock.drop_open()
        try:
            self._session.flops = _figures(mode, self._calls, self._module, self._batch)
        except Exception as err:  # never fail the fit over a count
            log.warning(f"lightning-perf: could not read the step's FLOP count: {err}")
        return True

    def abandon(self) -> None:
        """The fit ended inside the counted batch (an exception): leave the mode, keep no figure."""
        mode, self._mode = self._mode, None
        if mode is not None:
            mode.__exit__(None, None, None)


def _counting(op: Any, formula: Any, calls: Counter[str]) -> Any:
    """``formula`` (the registry's, already reading shapes) that also counts the operator's calls."""

    def count(*args: Any, **kwargs: Any) -> Any:
        calls[str(op)] += 1
        return formula(*args, **kwargs)

    count._get_raw = True  # type: ignore[attr-defined]  # FlopCounterMode must not wrap it a second time
    return count


def _figures(mode: FlopCounterMode, calls: Counter[str], module: torch.nn.Module, batch: int) -> StepFlops:
    counts = mode.get_flop_counts()
    operators = {str(op): float(n) for op, n in counts.get(_GLOBAL, {}).items() if n}
    step = StepFlops(
        flops=float(sum(operators.values())),
        batch=batch,
        operators=operators,
        operator_calls=dict(calls),
        modules=_modules(mode, counts, module),
    )
    if not step.flops:
        step.not_counted.append("no matmul, convolution or attention ran in the counted step")
    return step


def _modules(mode: FlopCounterMode, counts: dict[str, dict[Any, int]], module: torch.nn.Module) -> list:
    """Each module's FLOPs under its dotted path in ``module.named_modules()``. FlopCounterMode's names start
    at the class of the first module called (``Sequential.0``); its tracker maps modules to those names."""
    known = getattr(mode.mod_tracker, "_known_modules", {})  # private, hence the fallback to its own names
    paths = {id(m): path for path, m in module.named_modules()}
    renamed = {name: paths[id(m)] for m, name in list(known.items()) if id(m) in paths}
    totals: dict[str, float] = {}
    for name, ops in counts.items():
        path = renamed.get(name, name)
        flops = float(sum(ops.values()))
        if name != _GLOBAL and path and flops:
            totals[path] = max(totals.get(path, 0.0), flops)
    listed = sorted(totals.items(), key=lambda item: -item[1])[:MAX_MODULES]
    names = [path for path, _ in listed]
    return [
        ModuleFlops(path, flops, leaf=not any(other.startswith(path + ".") for other in names))
        for path, flops in listed
    ]


def _compiled(module: torch.nn.Module) -> bool:
    if getattr(module, "_compiled_call_impl", None) is not None or getattr(module, "_compiler_ctx", None):
        return True
    return any(type(m).__name__ == "OptimizedModule" for m in module.modules())
