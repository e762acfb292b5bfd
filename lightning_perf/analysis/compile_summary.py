"""What ``torch.compile`` did during a fit: the ``compile`` part of ``perf_summary.json``.

Filled while training by :mod:`lightning_perf.collect.compile_events` (dynamo's compile callbacks, its
compilation metrics and counters); read by the rules in :mod:`lightning_perf.analysis.rules.compile`.
Pure dataclasses: no torch, no Lightning.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Compilations kept one by one in a summary; beyond, only the counts and times grow (a run that recompiles
# thousands of times is told by its first ones, and the summary stays a few kB).
MAX_COMPILE_EVENTS = 100
# Characters kept of a recompile or graph-break reason: the guard or the explanation, not dynamo's whole hint.
MAX_REASON_CHARS = 400


@dataclass
class CompileEvent:
    """One compilation (a dynamo frame compile, with its lazily compiled backward added)."""

    compile_id: str  # dynamo's "frame/compile" id, e.g. "0/3": the 4th compile of the first frame
    step: int  # the training batch it ran in (0-based, counted across epochs like the profiler's steps)
    stage: str  # "train", or the pause it ran in: "validation", "checkpoint"
    duration_s: float = 0.0
    function: str | None = None  # the compiled function's name (dynamo's co_name)
    # for a recompile: the guard that failed, as dynamo words it ("tensor 'x' size mismatch at index 0. ...")
    recompile_reason: str | None = None
    # why dynamo did not compile, e.g. the recompile limit was hit (the frame then runs without compiling)
    failure: str | None = None
    # the step was open (timed) when it compiled, and is left out of the step statistics
    step_excluded: bool = False
    # the compiled code is Lightning's own (its logging, traced into the step by Lightning < 2.5), not the model's
    in_lightning: bool = False


@dataclass
class CompileSummary:
    """Every compilation of a fit, with the totals the console and the rules read.

    ``graphs`` and ``graph_breaks`` are dynamo's counters over the fit (``counters["stats"]["unique_graphs"]``,
    ``counters["graph_break"]``), ``break_reasons`` the break reasons with how often each was hit and
    ``break_sites`` where the traced code was resumed after a break (``torch_dynamo_resume_in_<fn>_at_<line>``).
    ``unmeasured`` lists what the torch in use could not tell (e.g. no recompile reasons).
    """

    compiles: int = 0
    recompiles: int = 0
    total_s: float = 0.0
    longest_s: float = 0.0
    steps_excluded: int = 0
    graphs: int | None = None
    graph_breaks: int | None = None
    break_reasons: dict[str, int] = field(default_factory=dict)
    break_sites: dict[str, int] = field(default_factory=dict)
    # the break sites that lie in Lightning's own code (lightning, torchmetrics, lightning_utilities)
    lightning_sites: list[str] = field(default_factory=list)
    recompile_limit_hit: bool = False
    events: list[CompileEvent] = field(default_factory=list)
    unmeasured: list[str] = field(default_factory=list)

    @property
    def recompile_events(self) -> list[CompileEvent]:
        return [e for e in self.events if e.recompile_reason is not None]
