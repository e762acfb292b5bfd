"""No two input findings of one run contradict each other: the check every real-fit input test applies.

Pairs that contradicted before issue 42: a workers count and a prefetch or persistent-workers change for the workers
the same run is told to drop; a "CPU-bound" title beside a loading measured to wait; a "measure again before acting"
row beside a workers count for a loading that computes on the cores others held; two different counts.
"""

from __future__ import annotations

from lightning_perf.analysis.rules.inputs.loading import WAITS, loading_of
from lightning_perf.analysis.summary import RunSummary

# findings that tune the workers a run has
WORKER_TUNING = ("prefetch_factor", "persistent_workers")


def contradictions(summary: RunSummary) -> list[str]:
    """Every contradiction between the run's findings, as sentences (empty when there is none)."""
    found = {f.id: f for f in summary.findings}
    said: list[str] = []
    counts = {
        f.id: f.settings_change["num_workers"] for f in summary.findings if "num_workers" in f.settings_change
    }
    if len(set(counts.values())) > 1:
        said.append(f"different num_workers advised: {counts}")
    current = summary.settings.num_workers or 0
    advised = counts.get("input_bound")
    if advised is not None and advised < current:
        said += [f"{i} tunes the workers the run is told to drop" for i in WORKER_TUNING if i in found]
    if advised == 0 and summary.findings and "persistent_workers" in found["input_bound"].settings_change:
        said.append("persistent workers advised with 0 workers")
    loading = loading_of(summary)
    if loading is not None and loading.cause == WAITS:
        said += [
            f"{f.id} calls a loading that waits CPU-bound" for f in summary.findings if "CPU-bound" in f.title
        ]
    held = found.get("noisy_machine")
    if (
        held is not None
        and held.severity == "high"
        and (loading is None or loading.cause != WAITS)
        and counts
    ):
        said.append(f"a workers count {counts} beside 'measure again before acting on CPU-side advice'")
    return said
