"""The measurements after a finished fit, before its findings are shown: a worker's hand-off of one batch
(every input-bound fit) and the num_workers probe (when ``probe_num_workers`` asks for it). Steps of
:func:`lightning_perf.run_end.pipeline.finish_run`.
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any

from lightning_perf import console
from lightning_perf.analysis.rules.thresholds import VERDICTS
from lightning_perf.analysis.summary import SUMMARY_FILENAME, RunSummary
from lightning_perf.collect.settings_fingerprint import train_dataloader

if TYPE_CHECKING:
    from lightning_perf.analysis.probe_results import HandOff
    from lightning_perf.collect.config import PerfConfig

log = console.logger(__name__)

# the verdicts for which probe_num_workers="auto" measures the DataLoader
PROBED_VERDICTS = VERDICTS[:2]
# the hand-offs kept for the next fits of this process (a sweep, a benchmark's rounds): a few loaders at most
MAX_KNOWN_HANDOFFS = 8


@dataclass
class ProbePlan:
    """The num_workers probe wanted after a fit: the DataLoader it measures and its budget in seconds, ``None``
    when the fit trained too few steps for a measured verdict (then the probe is skipped, and says so)."""

    dataloader: Any
    budget_s: float | None


def diagnosed(trainer: Any, summary: RunSummary, config: PerfConfig) -> bool:
    """Whether this rank diagnoses the run: rank zero of a fit, unless ``diagnose=False``."""
    return summary.stage == "fit" and trainer.is_global_zero and config.diagnose


def _input_bound(trainer: Any, summary: RunSummary, config: PerfConfig) -> str | None:
    """The input-bound verdict of a finished fit this rank diagnoses; None for any other run."""
    from lightning_perf.analysis.diagnosis import input_bound_verdict
    from lightning_perf.analysis.gpu_measures import input_wait

    if summary.status != "finished" or not diagnosed(trainer, summary, config):
        return None
    return input_bound_verdict(input_wait(summary).value)


def handoff_plan(trainer: Any, summary: RunSummary, config: PerfConfig) -> Any:
    """The training DataLoader when a finished fit is input-bound, so its advice is about workers; else None.
    Whatever ``probe_num_workers`` says: the hand-off costs a fraction of a second and decides the advice."""
    if _input_bound(trainer, summary, config) not in PROBED_VERDICTS:
        return None
    return train_dataloader(trainer)


def probe_plan(trainer: Any, summary: RunSummary, config: PerfConfig) -> ProbePlan | None:
    """The num_workers probe wanted after this fit; ``None`` when it is not wanted or not possible."""
    from lightning_perf.probes.num_workers import probe_budget

    if summary.status != "finished" or not diagnosed(trainer, summary, config):
        return None
    verdict = _input_bound(trainer, summary, config)
    mode = config.probe_num_workers
    if not (mode == "always" or (mode == "auto" and verdict in PROBED_VERDICTS)):
        return None
    dataloader = train_dataloader(trainer)
    if dataloader is None:
        return None
    return ProbePlan(dataloader, probe_budget(summary.timing.train_wall_s, config.probe_budget_s, mode))


@dataclass
class _KnownHandOff:
    """A hand-off measured in this process: the same dataset in batches of the same make costs the same."""

    dataset: weakref.ref[Any]
    collate_fn: Any
    batch_size: int | None
    pin_memory: bool
    found: HandOff

    def matches(self, dataloader: Any) -> bool:
        return (
            self.dataset() is dataloader.dataset
            and self.collate_fn is dataloader.collate_fn
            and self.batch_size == dataloader.batch_size
            and self.pin_memory == dataloader.pin_memory
        )


_KNOWN: list[_KnownHandOff] = []


def known_handoff(dataloader: Any) -> HandOff | None:
    """The hand-off measured for this loader's dataset and batch settings by an earlier fit of this process."""
    _KNOWN[:] = [known for known in _KNOWN if known.dataset() is not None]
    found = next((known.found for known in _KNOWN if known.matches(dataloader)), None)
    return dataclasses.replace(found) if found is not None else None


def _keep(dataloader: Any, found: HandOff) -> None:
    try:
        dataset = weakref.ref(dataloader.dataset)
    except TypeError:  # a dataset that takes no weak reference (a plain list): measured again next fit
        return
    settings = (dataloader.collate_fn, dataloader.batch_size, bool(dataloader.pin_memory))
    _KNOWN.append(_KnownHandOff(dataset, *settings, found=dataclasses.replace(found)))
    del _KNOWN[:-MAX_KNOWN_HANDOFFS]


def measure_handoff(summary: RunSummary, dataloader: Any) -> None:
    """What one batch costs to hand over from a worker (:mod:`lightning_perf.probes.handoff`), into
    ``summary.probes.handoff``: a fraction of a second, one worker started and stopped, once per dataset and
    batch settings in a process (a later fit of the same loader reuses it), with one line saying what it took."""
    from lightning_perf.probes.handoff import measure_handoff as measure

    known = known_handoff(dataloader)
    if known is not None:
        summary.probes.handoff = known
        log.debug("lightning-perf: the hand-off of a batch from a worker: as measured by an earlier fit")
        return
    started = perf_counter()
    found = measure(dataloader)
    summary.probes.handoff = found
    if found.error:
        log.info(f"lightning-perf: the hand-off of a batch from a worker was not measured: {found.error}")
        return
    _keep(dataloader, found)
    log.info(
        f"lightning-perf: measured the hand-off of a batch from a worker in {perf_counter() - started:.2f} s "
        "(once per dataset and batch size in this process)"
    )


def probe_num_workers(summary: RunSummary, dataloader: Any, budget: float) -> None:
    """The num_workers probe of a finished fit into ``summary.probes.num_workers``.

    Runs after the summary of what training measured is saved, with one line saying so and what it may cost: an
    interrupt here (Ctrl-C while waiting) loses nothing but the probe. Where the run's loading was measured to
    wait (storage, sleep: rules/inputs/loading.py), the probe tries counts past the cores.
    """
    from lightning_perf.analysis.rules.inputs.loading import WAITS, loading_of
    from lightning_perf.probes.num_workers import probe_num_workers as probe

    log.info(
        f"lightning-perf: measuring DataLoader num_workers (up to {budget:.3g} s; "
        f"{SUMMARY_FILENAME} is written, Ctrl-C skips this)"
    )
    compute = summary.timing.compute_ms.mean if summary.timing.compute_ms else None
    loading = loading_of(summary)
    handoff = summary.probes.handoff
    found = probe(
        dataloader,
        compute,
        budget_s=budget,
        loading_waits=loading is not None and loading.cause == WAITS,
        handoff_main_ms=handoff.main_ms if handoff is not None else None,
    )
    summary.probes.num_workers = found
    said = "no value" if found.suggested is None else f"num_workers={found.suggested}"
    log.info(f"lightning-perf: num_workers probe: suggests {said}: {found.reason}")
