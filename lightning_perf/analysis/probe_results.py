"""What the measured probes after a fit found, as the summary keeps them (``RunSummary.probes``).

Each probe's result is a dataclass, made by its probe in :mod:`lightning_perf.probes` and decoded from
``perf_summary.json`` like every other section of the summary (:mod:`lightning_perf.analysis.summary_decode`).
The JSON is the layout the releases before these types wrote: ``"probes"`` holds one object per probe that ran,
under its name, and a probe that did not run is absent (:meth:`Probes.to_dict`). Every field has a default, so a
summary written before a field was added still decodes. Pure: no torch, no Lightning.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class HandOff:
    """What one batch costs to hand over from a DataLoader worker (:mod:`lightning_perf.probes.handoff`).

    ``ms_per_batch``: steady wall time per batch delivered by one worker replaying the run's batch (None when not
    measured); ``main_ms``: this thread's CPU time per batch received and read (``touch_ms`` of it reading one
    value of each page, the faults a training step takes on a received batch); ``load_ms``: the wall time per
    batch of ``load_batches`` batches fetched in this process with 0 workers (the loading alone, no hand-off);
    ``batch_bytes`` and ``tensors``: what one batch holds; ``batches``: batches timed; ``error``: why it was not
    measured ("" when it was).
    """

    ms_per_batch: float | None = None
    main_ms: float | None = None
    touch_ms: float | None = None
    load_ms: float | None = None
    load_batches: int = 0
    batch_bytes: int = 0
    tensors: int = 0
    batches: int = 0
    error: str = ""


@dataclass
class NumWorkersProbe:
    """The num_workers probe's result (:mod:`lightning_perf.probes.num_workers`).

    ``candidates`` holds one dict per tried ``num_workers``: ``num_workers``, ``status`` (``"measured"`` or
    ``"not measured"``), ``startup_ms`` (time to the first batch), ``batches_per_sec`` (steady delivery rate,
    the median of the fresh starts; ``None`` when not measured), ``repeat_rates`` (the steady rate of each fresh
    start; their minimum is the rate a selection uses), ``batches`` (fetched in all), ``error`` (``None``, or
    why the candidate was not measured), ``predicted_wait_ms`` (the loop's predicted wait for data per step:
    the whole load time of a batch with 0 workers, max(0, load time - compute time) with 1 or more; ``None``
    when not measured or without a compute rate), ``predicted_step_ms`` (compute plus that wait) and
    ``settled`` (every start's rate settled within its time). Older summaries lack some of these keys.

    ``loading_waits`` is the caller's word that the loading waits (CPU time well below wall time), which let
    the candidates go past the usable cores. ``disturbed`` is True when other processes busied the machine
    while it measured: the rates are then not used and ``suggested`` is ``None``. ``machine_note`` says what
    busied it ("" otherwise).
    """

    candidates: list[dict[str, Any]] = field(default_factory=list)
    compute_batches_per_sec: float | None = None
    suggested: int | None = None
    reason: str = ""
    machine_note: str = ""
    loading_waits: bool = False
    disturbed: bool = False


@dataclass
class CudnnAB:
    """The cudnn.benchmark A/B (:mod:`lightning_perf.probes.cudnn_benchmark`): ``applies`` and ``reason``
    always; ``off_ms``, ``on_ms`` (medians of forward+backward passes), ``speedup`` (off / on) and
    ``user_setting`` (the flag as the user left it) when it ran; ``ranks`` and ``collective_modules`` (the module
    classes whose forward issues collectives) when it ran on every rank of a multi-process job."""

    applies: bool = False
    reason: str = ""
    off_ms: float | None = None
    on_ms: float | None = None
    speedup: float | None = None
    user_setting: bool | None = None
    ranks: int | None = None
    collective_modules: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object, with only the keys that were measured (what the releases before this type wrote)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None and v != []}


@dataclass
class Probes:
    """The probes a run measured after its last step; ``None`` for each that did not run."""

    num_workers: NumWorkersProbe | None = None
    handoff: HandOff | None = None
    cudnn_benchmark: CudnnAB | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: one entry per probe that ran, none for the others."""
        found: dict[str, Any] = {}
        if self.num_workers is not None:
            found["num_workers"] = dataclasses.asdict(self.num_workers)
        if self.handoff is not None:
            found["handoff"] = dataclasses.asdict(self.handoff)
        if self.cudnn_benchmark is not None:
            found["cudnn_benchmark"] = self.cudnn_benchmark.to_dict()
        return found
