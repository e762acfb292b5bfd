"""PerfCallback: the Lightning hooks that drive profiling, timing, utilization and diagnosis."""

from __future__ import annotations

import os
import socket
from time import perf_counter
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from typing_extensions import override

from lightning_perf import console
from lightning_perf.analysis.summary import RunSummary, TraceFile
from lightning_perf.collect import flop_count, namespaces, run_state
from lightning_perf.collect.config import ProbeMode, TraceRanks, config_of
from lightning_perf.collect.rank_exchange import RankReducer
from lightning_perf.collect.run_state import PerfSession, first_tensor, open_session
from lightning_perf.collect.sampling import sampler_start
from lightning_perf.collect.steps import fetch_timing as fetcher_hooks
from lightning_perf.collect.steps import hook_profiler
from lightning_perf.errors import ConfigError
from lightning_perf.output import loggers, windows
from lightning_perf.output.end_of_run import bulk_writes
from lightning_perf.probes.cudnn_benchmark import BatchSpec
from lightning_perf.run_end.context import RunEnd
from lightning_perf.run_end.measure import now
from lightning_perf.run_end.pipeline import finish_run

log = console.logger(__name__)

_RUNTIME_ATTRS = ("_fit", "_eval", "_sampler", "_reducer", "_trace_dir", "_fit_started", "_started_at")
_RUNTIME_ATTRS += ("_hp_placeholder", "_ab_spec", "_flops")
_EVAL_STAGES = {"validate": "validate_loop", "test": "test_loop", "predict": "predict_loop"}


# a subclass of lightning.pytorch.Callback and, where it is installed, of pytorch_lightning.Callback
class PerfCallback(*namespaces.callback_bases()):
    r"""Profile, time and diagnose training with one line: ``Trainer(callbacks=[PerfCallback()])``.

    The callback starts and steps ``torch.profiler`` on batch boundaries according to a schedule (the same
    semantics as ``torch.profiler.schedule``, counted over training batches across epochs), writes one trace
    per recorded cycle to the run's log dir (torch-tb-profiler's layout), and measures every training batch.

    Logged every ``log_every_n_steps`` batches (windows of very fast steps are stretched to whole multiples of
    it lasting at least ``log_min_interval_s``) through the Trainer's loggers, at ``trainer.global_step``: step
    time, DataLoader wait, compute, throughput and utilization as ``perf_*/*`` metrics (the metric table of docs/metrics.md
    lists each with its unit and meaning).

    At the end of ``fit`` the run summary is written to ``perf_summary.json`` in the log dir, with the
    diagnosis (also in TensorBoard's Text tab as ``perf_text/diagnosis``, and on the console).

    Args:
        skip_first: training batches ignored before the first profiling cycle.
        wait: idle batches at the start of each cycle.
        warmup: batches the profiler runs but discards at the start of each cycle.
        active: batches recorded per cycle (one trace file per cycle and rank).
        repeat: number of cycles; 0 profiles cycle after cycle until training ends.
        activities: "cpu" and/or "cuda"; default: cpu, plus cuda when training on a CUDA device.
        record_shapes: record operator input shapes (bigger traces).
        profile_memory: record tensor allocations (bigger traces).
        with_stack: record Python stacks (much bigger traces); enables the flame-graph export.
        with_flops: estimate FLOPs of matrix multiplications and convolutions.
        dirpath: directory for traces and the summary; default: the TensorBoard logger's log dir, else the first
            logger's run dir, else a new ``default_root_dir/lightning_perf_logs/version_N``.
        max_trace_mb: cap on the trace bytes written per run and rank; later cycles are skipped past it.
        export_stacks: write collapsed stacks for flame graphs beside each trace (needs ``with_stack``).
        export_speedscope: write a Speedscope JSON file beside each trace.
        export_memory_timeline: write the memory timeline HTML (needs profile_memory, record_shapes, with_stack).
        enable_profiler: False measures timing and utilization only, with no torch profiler at all.
        batch_size: samples per batch for throughput; default: the first dimension of the batch's first tensor.
        log_every_n_steps: batches per logged window; default: the Trainer's ``log_every_n_steps``.
        log_min_interval_s: a window lasts at least this long (a multiple of ``log_every_n_steps`` batches), so
            sub-millisecond steps are not logged dozens of times a second; 0 logs every ``log_every_n_steps``.
        utilization: sample GPU (NVML) and CPU (psutil) utilization on a background thread.
        util_interval_s: seconds between utilization samples.
        diagnose: diagnose the run at the end of ``fit`` and recommend fixes.
        probe_num_workers: "auto" measures DataLoader throughput per num_workers when the run is input-bound,
            "always" whatever the verdict, "never" not at all.
        probe_budget_s: total seconds the num_workers probe may take: with "auto" its cap (the probe takes 20%
            of the fit's training time), with "always" all of it.
        ab_cudnn_benchmark: at the end of ``fit`` on CUDA with convolutions, time the model on one batch with
            ``cudnn.benchmark`` off and on (the user's setting is restored).
        log_hparams: put the settings fingerprint and headline results in TensorBoard's HParams tab.
        trace_ranks: global ranks that record traces: "all", a list, or "auto" (every rank up to 8, else
            rank 0, each node's first rank and the last); the others still time, sample and join the rank table.
        profile_on_slowdown: record one extra profiler cycle when the step time rises lastingly mid-run.
        flops_per_batch: FLOPs of one training batch, for the MFU; default: one real step's, counted once a fit.

    Example::

        trainer = Trainer(callbacks=[PerfCallback(wait=1, warmup=1, active=3, repeat=2)])
        trainer.fit(model, datamodule)
    """

    def __init__(
        self,
        skip_first: int = 5,
        wait: int = 1,
        warmup: int = 1,
        active: int = 3,
        repeat: int = 1,
        activities: list[str] | None = None,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        with_flops: bool = False,
        dirpath: str | None = None,
        max_trace_mb: float = 500.0,
        export_stacks: bool = True,
        export_speedscope: bool = False,
        export_memory_timeline: bool = True,
        enable_profiler: bool = True,
        batch_size: int | None = None,
        log_every_n_steps: int | None = None,
        log_min_interval_s: float = 1.0,
        utilization: bool = True,
        util_interval_s: float = 0.1,
        diagnose: bool = True,
        probe_num_workers: ProbeMode = "auto",
        probe_budget_s: float = 10.0,
        ab_cudnn_benchmark: bool = True,
        log_hparams: bool = True,
        trace_ranks: TraceRanks = "auto",
        profile_on_slowdown: bool = True,
        flops_per_batch: float | None = None,
    ) -> None:
        super().__init__()
        self.config = config_of(locals())  # under LightningCLI a bad argument ends in one line naming it
        self._reset_runtime()
        #: the summary of the last finished run (fit, or validate/test/predict)
        self.last_summary: RunSummary | None = None

    # -- pickling: no profilers, threads or fetchers travel (ddp_spawn, deepcopy) ------------------------

    def _reset_runtime(self) -> None:
        self._fit: PerfSession | None = None
        self._eval: PerfSession | None = None
        self._sampler: Any = None
        self._reducer: RankReducer | None = None
        self._trace_dir: str | None = None
        self._log_every = 50
        self._window_batches = 50
        self._fit_started = 0.0
        self._started_at: str | None = None
        self._hp_placeholder = False
        self._ab_spec: BatchSpec | None = None
        self._flops: flop_count.FlopCount | None = None  # until the one counted step has ended

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in _RUNTIME_ATTRS:
            state[name] = None
        state["_log_every"] = state["_window_batches"] = 50
        return state

    # -- set-up --------------------------------------------------------------------------------------------

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        pytorch_profiler = namespaces.is_instance(trainer.profiler, "profilers", "PyTorchProfiler")
        if pytorch_profiler and self.config.enable_profiler:
            raise ConfigError(
                "`Trainer(profiler=...)` is a PyTorchProfiler and PerfCallback drives torch.profiler itself: "
                "the two would disable each other. Remove the Trainer's profiler (PerfCallback records the "
                "same traces), or pass `PerfCallback(enable_profiler=False)`."
            )
        run_state.one_per_trainer(trainer.callbacks, self, PerfCallback)
        run_state.traced_ranks(trainer, self.config)  # trace_ranks naming a rank the job lacks fails here
        if self.config.enable_profiler:  # before the first torch profiler of the process starts
            console.quiet_kineto(torch.cuda.is_available())
        # collectives and trainer.log_dir (which broadcasts) run here, on every rank, never in rank-zero code
        self._trace_dir = self._resolve_dir(trainer)
        self._log_every = self.config.log_every_n_steps or max(1, int(trainer.log_every_n_steps or 50))
        self._window_batches = self._log_every
        if stage == "fit":
            self._reducer = RankReducer()
            self._reducer.gather_hosts(socket.gethostname(), trainer.node_rank)
            if self.config.log_hparams:
                # before Lightning writes its hp_metric placeholder, which would hide ours (see loggers.py)
                self._hp_placeholder = loggers.disable_default_hp_metric(trainer)

    def _resolve_dir(self, trainer: Trainer) -> str:
        """``dirpath``, else this run's own folder (see ``loggers.run_dir``): found on rank zero, where the
        loggers' runs exist, and broadcast (a collective: setup runs on every rank)."""
        if self.config.dirpath is not None:
            return self.config.dirpath
        return trainer.strategy.broadcast(loggers.run_dir(trainer) if trainer.is_global_zero else None)

    def _new_session(self, trainer: Trainer, stage: str, loop_name: str) -> PerfSession:
        def on_trace(session: PerfSession, trace: TraceFile) -> None:
            self._trace_written(trainer, session, trace)

        fetcher = fetcher_hooks.loop_fetcher(getattr(trainer, loop_name))
        session = open_session(trainer, stage, fetcher, self.config, self._trace_dir, on_trace)
        if session.hook_timing is not None:
            fetcher_hooks.HookTiming.warn(trainer, stage, loop_name)
        return session

    def _trace_written(self, trainer: Trainer, session: PerfSession, trace: TraceFile) -> None:
        """A cycle was saved: read once after the last step (output.trace_findings)."""
        session.cuda_traces.append((os.path.join(session.window.trace_dir, trace.path), trainer.global_step))

    # -- training ------------------------------------------------------------------------------------------

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._started_at = now()
        self._fit_started = perf_counter()
        self._fit = self._new_session(trainer, "fit", "fit_loop")
        hook_profiler.install(trainer, self, self._fit)  # the step's anatomy, the code named in traces
        if self._reducer is not None:
            self._reducer.check_batch_counts(trainer.num_training_batches)  # collective, on every rank
        loggers.write_custom_scalars_layout(trainer)
        self._ab_spec = None
        self._flops = flop_count.start(self.config, self._fit, pl_module)
        if self.config.utilization:
            self._start_sampler(trainer)

    @override
    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        session = self._fit
        if session is None:
            return
        if session.hook_timing is not None:
            session.clock.epochs += 1  # no fetch to time: the epoch's first batch is an ordinary step
            return
        fetcher = fetcher_hooks.loop_fetcher(trainer.fit_loop)
        if not fetcher_hooks.is_instrumented(fetcher):  # reload_dataloaders_every_n_epochs made a new one
            fetcher_hooks.instrument(fetcher, session)
        session.clock.epoch_started()

    @override
    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        # this hook and the next run on every batch: each check is an attribute and a comparison
        sampler = self._sampler
        if sampler is not None and sampler.paused:
            sampler.resume()  # utilization is kept over training steps, the intervals step timing covers
        if self._ab_spec is None and self.config.ab_cudnn_benchmark:  # on every rank: under DDP all run it
            # the shape, dtype and memory format of a batch (not the batch) for the cudnn.benchmark A/B
            self._ab_spec = BatchSpec.of(first_tensor(batch))
        session = self._fit
        if session is not None and session.hook_timing is not None:
            session.hook_timing.batch_started(batch)
        if self._flops is not None:
            self._flops.batch_started()

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._flops is not None and self._flops.batch_ended():
            self._flops = None
        session = self._fit
        if session is not None and session.clock.window_steps >= self._window_batches:
            started = perf_counter()
            self._flush_window(trainer, session, collective=True)
            session.clock.exclude(perf_counter() - started)

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._interrupt(None)

    @override
    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        self._interrupt("checkpoint")

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._fit is not None:
            self._finish_fit(trainer, "finished")

    def _interrupt(self, kind: str | None) -> None:
        session = self._fit
        if session is None:
            return
        session.clock.interrupt(perf_counter(), kind)
        if session.window is not None:
            session.window.end_step_span()
        if self._sampler is not None:  # until the next step: epoch ends, validation, checkpoints
            self._sampler.pause()

    def _flush_window(self, trainer: Trainer, session: PerfSession, collective: bool) -> None:
        sampled = self._sampler.take_window() if self._sampler is not None else {}
        reducer = self._reducer if collective else None
        # left out of the step, so of the loggers' part too; the window's ~20 scalars go to TensorBoard's writer
        # thread without waiting on its queue of 10 (it writes them while training goes on)
        with hook_profiler.paused(session.hooks), bulk_writes(trainer):
            self._window_batches = windows.flush(
                trainer, session, sampled, reducer, self._log_every, self.config
            )

    def _start_sampler(self, trainer: Trainer) -> None:
        self._stop_sampler()  # never two sampler threads, whatever called this twice
        self._sampler = sampler_start.start_for(trainer, self.config.util_interval_s)

    def _stop_sampler(self) -> Any:
        sampler, self._sampler = self._sampler, None
        if sampler is not None:
            sampler.stop()
        return sampler

    # -- validation inside fit, and standalone validate / test / predict ----------------------------------

    @override
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking:
            return
        if self._fit is not None:
            self._interrupt("validation")
        else:
            self._start_eval(trainer, "validate")

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking:
            return
        if self._fit is not None:
            self._fit.clock.settle(perf_counter())
        else:
            self._finish_eval(trainer, "finished")

    @override
    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start_eval(trainer, "test")

    @override
    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._finish_eval(trainer, "finished")

    @override
    def on_predict_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start_eval(trainer, "predict")

    @override
    def on_predict_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._finish_eval(trainer, "finished")

    def _start_eval(self, trainer: Trainer, stage: str) -> None:
        self._started_at = now()
        self._fit_started = perf_counter()
        self._eval = self._new_session(trainer, stage, _EVAL_STAGES[stage])
        self._eval.clock.epoch_started()

    def _finish_eval(self, trainer: Trainer, status: str) -> None:
        session, self._eval = self._eval, None
        if session is None:
            return
        loop = getattr(trainer, _EVAL_STAGES[session.stage])
        self._finish(trainer, session, status, fetcher_hooks.loop_fetcher(loop))

    # -- the end of a run, however it ends -----------------------------------------------------------------

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        status = run_state.run_status(exception)
        if self._fit is not None:
            self._finish_fit(trainer, status)
        self._finish_eval(trainer, status)

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # normally everything ended in on_train_end / on_*_end; this is the safety net
        for session in (self._fit, self._eval):
            if session is not None and session.window is not None:
                session.window.close()
            if session is not None:
                hook_profiler.uninstall(trainer, session.hooks)
        self._stop_sampler()
        for loop_name in ("fit_loop", *_EVAL_STAGES.values()):
            fetcher_hooks.uninstrument(fetcher_hooks.loop_fetcher(getattr(trainer, loop_name)))
        if self._hp_placeholder:
            loggers.restore_default_hp_metric(trainer)  # the user's logger as it was, for a later fit
        if self._reducer is not None:  # after the last collective of ours, on every rank
            self._reducer.close()
        self._reset_runtime()

    def _finish_fit(self, trainer: Trainer, status: str) -> None:
        self._flops = flop_count.abandon(self._flops)  # the fit may have ended inside the counted step
        session, self._fit = self._fit, None
        self._finish(trainer, session, status, fetcher_hooks.loop_fetcher(trainer.fit_loop))

    def _finish(self, trainer: Trainer, session: PerfSession, status: str, fetcher: Any) -> None:
        """Stop measuring, then summarise, diagnose and write. Never raises: the run's own outcome wins."""
        ended = perf_counter()
        fetcher_hooks.uninstrument(fetcher)
        session.clock.interrupt(ended)
        hook_profiler.uninstall(trainer, session.hooks)  # the user's own profiler and loggers as they were
        if session.window is not None:
            session.window.close()
        fit = session.stage == "fit"
        # collectives only when every rank gets here the same way: a rank that raised calls none
        collective = fit and status == "finished"
        if fit and session.clock.window_steps:
            try:  # before the sampler stops, so the last window keeps its utilization figures
                self._flush_window(trainer, session, collective)
            except Exception as err:
                log.warning(f"lightning-perf: could not log the last window: {err}")
        if fit:
            with bulk_writes(trainer):  # the whole run's steps in TensorBoard; never raises
                windows.write_step_series(trainer, session)
        end = RunEnd(
            trainer,
            session,
            self.config,
            status=status,
            wall_s=ended - self._fit_started,
            started_at=self._started_at,
            log_dir=self._trace_dir,
            sampler=self._stop_sampler() if fit else None,
            reducer=self._reducer if collective else None,
            ab_spec=self._ab_spec,
            hp_placeholder=self._hp_placeholder,
        )
        self._ab_spec = None
        try:  # measure, probe, diagnose, write (run_end.pipeline)
            finish_run(end)
        finally:  # a Ctrl-C in the num_workers probe propagates: the summary of what was measured is kept
            if end.summary is not None:
                self.last_summary = end.summary
