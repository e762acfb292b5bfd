"""lightning-perf: one-line performance profiling for PyTorch Lightning.

``Trainer(callbacks=[PerfCallback()])`` profiles training on a schedule, measures DataLoader wait,
step time, throughput and utilization, diagnoses the bottleneck and logs it all to TensorBoard.
"""

__version__ = "0.1.0"

__all__ = ["PerfCallback", "RunSummary", "__version__"]


def __getattr__(name: str):
    # Lazy: `lightning-perf compare` and the pure modules must not pay for importing Lightning.
    if name == "PerfCallback":
        from lightning_perf.callback import PerfCallback

        return PerfCallback
    if name == "RunSummary":
        from lightning_perf.analysis.summary import RunSummary

        return RunSummary
    raise AttributeError(f"module 'lightning_perf' has no attribute {name!r}")
