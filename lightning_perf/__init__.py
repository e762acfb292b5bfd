"""lightning-perf: one-line performance profiling for PyTorch Lightning.

``Trainer(callbacks=[PerfCallback()])`` profiles training on a schedule, measures DataLoader wait,
step time, throughput and utilization, diagnoses the bottleneck and logs it all to TensorBoard.

The public names are loaded lazily, so ``import lightning_perf`` (and the ``compare`` command) does not
import torch or Lightning.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.2.0"

# public name -> the module that defines it
_PUBLIC = {
    "PerfCallback": "lightning_perf.callback",
    "RunSummary": "lightning_perf.analysis.summary",
    "Finding": "lightning_perf.analysis.summary",
    "diagnose": "lightning_perf.analysis.diagnosis",
    "compare": "lightning_perf.analysis.verdicts.comparison",
    "Comparison": "lightning_perf.analysis.verdicts.comparison",
    "MetricChange": "lightning_perf.analysis.verdicts.statistics",
    "run_trial": "lightning_perf.trial.api",
    "Variant": "lightning_perf.trial.spec",
    "TrialResult": "lightning_perf.trial.spec",
    "LightningPerfError": "lightning_perf.errors",
}

__all__ = [
    "Comparison",
    "Finding",
    "LightningPerfError",
    "MetricChange",
    "PerfCallback",
    "RunSummary",
    "TrialResult",
    "Variant",
    "__version__",
    "compare",
    "diagnose",
    "run_trial",
]

if TYPE_CHECKING:  # what IDEs and type checkers see; at run time __getattr__ imports on first use
    from lightning_perf.analysis.diagnosis import diagnose
    from lightning_perf.analysis.summary import Finding, RunSummary
    from lightning_perf.analysis.verdicts.comparison import Comparison, compare
    from lightning_perf.analysis.verdicts.statistics import MetricChange
    from lightning_perf.callback import PerfCallback
    from lightning_perf.errors import LightningPerfError
    from lightning_perf.trial.api import run_trial
    from lightning_perf.trial.spec import TrialResult, Variant


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_perf' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
