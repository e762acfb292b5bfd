"""End of fit with recorded CUDA activity: the trace figures, findings and chart of the run's own cycles.

This machine has no GPU, so the cycle is a real GPU trace recorded by others (tests/data/realtraces), handed to
the callback where its profiler would have handed over its own CUDA cycle; everything after that is the real
end-of-fit path of a real ``Trainer.fit``.
"""

from __future__ import annotations

import os
import shutil

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_perf import PerfCallback
from lightning_perf.analysis.summary import RunSummary
from lightning_perf.output import trace_findings
from lightning_perf.traces.report.build import find_traces
from tests.callback.test_diagnosis import diagnosis_text
from tests.helpers import TinyModel, loader, trainer


class HandOverCycle(PerfCallback):
    """Hands a recorded GPU trace to the session as if this run's profiler had saved it at step 3 (the
    profiler itself is off: its own CPU cycle would be read too)."""

    def __init__(self, trace: str, **kwargs) -> None:
        super().__init__(enable_profiler=False, **kwargs)
        self.trace = trace

    def on_train_start(self, trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        self._fit.cuda_traces.append((self.trace, 3))


def test_fit_adds_the_findings_figures_and_chart_of_its_cuda_cycles(tmp_path, realtraces):
    (source,) = find_traces(str(realtraces / "resnet50_v100_workers4"))
    trace = str(tmp_path / os.path.basename(source))
    shutil.copy(source, trace)
    callback = HandOverCycle(trace, skip_first=2, wait=1, warmup=1, active=2, probe_num_workers="never")
    fit_trainer = trainer(tmp_path, [callback], limit_train_batches=12)
    fit_trainer.fit(TinyModel(), loader(n=48, batch_size=4))
    log_dir = fit_trainer.logger.log_dir

    saved = RunSummary.load(os.path.join(log_dir, "perf_summary.json"))
    (figures,) = saved.trace_figures
    assert figures.source == os.path.basename(trace) and figures.steps == 6
    assert saved.utilization.gpu.kernel_busy_pct == figures.kernel_busy_pct
    assert saved.utilization.gpu.compute_busy_pct == figures.compute_busy_pct
    ids = {f.id: f for f in saved.findings}
    assert ids["mixed_precision"].settings_change == {"precision": "16-mixed"}
    assert "tensor-core-eligible" in ids["mixed_precision"].evidence
    assert "pageable_memcpy" in ids and "gpu_idle" in ids
    # the run's own DataLoader timing gives the input verdict, not the trace
    assert ids["input_bound"].evidence.startswith("DataLoader wait is")
    assert "Matmuls and convolutions run without tensor cores" in diagnosis_text(log_dir)

    events = EventAccumulator(log_dir, size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    (image,) = events.Images(trace_findings.CHART_TAG)
    assert image.width > 500 and image.height > 200
    busy = {s.step: s.value for s in events.Scalars(trace_findings.KERNEL_BUSY_PCT)}
    assert busy == {3: pytest.approx(figures.kernel_busy_pct, rel=1e-5)}
    assert events.Scalars(trace_findings.COMPUTE_BUSY_PCT)[0].step == 3


def test_an_unreadable_cycle_costs_a_warning_not_the_run(tmp_path, caplog):
    broken = tmp_path / "broken.pt.trace.json"
    broken.write_text('{"traceEvents": [')
    callback = HandOverCycle(str(broken), skip_first=2, wait=1, warmup=1, active=2, probe_num_workers="never")
    fit_trainer = trainer(tmp_path, [callback], limit_train_batches=8)
    fit_trainer.fit(TinyModel(), loader(n=32, batch_size=4))
    assert callback.last_summary is not None and callback.last_summary.trace_figures == []
    assert "could not read kernel activity" in caplog.text
