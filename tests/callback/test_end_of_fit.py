"""The end of a real fit, read by a person (issue 37): one answer a run (the verdict, where a profiled step's
time went, the findings that apply or why none does), perf_diagnosis.md with or without a logger, and a last
line naming the run folder, its files and the commands that open them."""

import logging
import os
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_perf import PerfCallback
from lightning_perf.analysis.findings_render import render_console
from lightning_perf.output.end_of_run import traces_phrase
from lightning_perf.output.loggers import NO_LOGGER_DIR
from tests.helpers import TinyModel, loader, trainer

TABLE_HEADER = "severity   finding"


class ConvNet(L.LightningModule):
    """A small conv net on in-memory tensors: its step is convolutions, its batches are slices (compute-bound)."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(16, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(16, 10),
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def conv_data(steps=64, batch_size=8):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(steps * batch_size, 3, 32, 32, generator=generator)
    y = torch.randint(0, 10, (steps * batch_size,), generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size)


def ours(caplog):
    return [r.getMessage() for r in caplog.records if r.name.startswith("lightning_perf")]


def fit_conv(tmp_path, caplog, **trainer_kwargs):
    # the default schedule (skip_first=5, wait=1, warmup=1, active=3) records batches 7-9 of the 64
    callback = PerfCallback(probe_num_workers="never")
    with caplog.at_level(logging.INFO, logger="lightning_perf"):
        trainer(tmp_path, [callback], **trainer_kwargs).fit(ConvNet(), conv_data())
    return callback.last_summary, "\n".join(ours(caplog)), ours(caplog)


def test_a_compute_bound_fit_names_its_top_operators_and_what_applies(tmp_path, caplog):
    summary, text, lines = fit_conv(tmp_path, caplog)
    (figures,) = summary.trace_figures  # the one recorded cycle, CPU-only, read at the end of fit
    assert figures.step_numbers == [7, 8, 9]
    top = [op.name for op in figures.top_operators]
    assert any(name.startswith("aten::convolution") or name.startswith("aten::mkldnn") for name in top), top
    # the answer: the verdict, then where the step's time went, by operator, from the recorded cycle
    assert "where a profiled step's time went (steps 7-9" in text
    listed = [
        line
        for line in text.splitlines()
        for name in top
        if name.startswith("aten::") and f" {name} (" in line
    ]
    assert listed, text
    assert text.index("where a profiled step's time went") < text.index(listed[0])
    # then the findings that apply, in one table, or the reason none does
    assert text.count(TABLE_HEADER) + text.count("no finding applies: ") == 1, text
    # one verdict line per fit
    verdicts = [line for line in lines if "input-bound - DataLoader wait" in line]
    assert len(verdicts) == 1, text


def test_the_last_line_names_the_run_folder_its_files_and_how_to_open_them(tmp_path, caplog):
    summary, _, lines = fit_conv(tmp_path, caplog)
    log_dir = summary.log_dir
    last = lines[-1].splitlines()[-1]
    assert last.startswith(f"lightning-perf: run folder {log_dir}: ")
    for name in ("perf_summary.json", "perf_diagnosis.md", os.path.basename(summary.traces[0].path)):
        assert name in last and os.path.exists(os.path.join(log_dir, os.path.basename(name)))
    assert f"tensorboard --logdir {log_dir}" in last and f"lightning-perf report {log_dir}" in last
    # the diagnosis file holds the console's answer: verdict, findings, top operators
    diagnosis = Path(log_dir, "perf_diagnosis.md").read_text(encoding="utf-8")
    assert "**Verdict:" in diagnosis and "### Top operators" in diagnosis and "`aten::" in diagnosis


def test_a_run_without_a_logger_gets_perf_diagnosis_md(tmp_path, caplog):
    summary, _, lines = fit_conv(tmp_path, caplog, logger=False)
    log_dir = os.path.join(str(tmp_path), NO_LOGGER_DIR, "version_0")
    assert summary.log_dir == log_dir
    assert os.path.isfile(os.path.join(log_dir, "perf_diagnosis.md"))
    last = lines[-1].splitlines()[-1]
    assert f"run folder {log_dir}: perf_summary.json, perf_diagnosis.md, 1 trace" in last


def test_a_run_too_short_for_a_trace_says_how_to_get_one(tmp_path, caplog):
    callback = PerfCallback(probe_num_workers="never")  # the first trace is written after batch 10
    with caplog.at_level(logging.INFO, logger="lightning_perf"):
        trainer(tmp_path, [callback], limit_train_batches=6).fit(ConvNet(), conv_data())
    text = "\n".join(ours(caplog))
    assert "no trace recorded: run longer than 10 steps or set a shorter profiling schedule" in text
    assert "skip_first=5, wait=1, warmup=1, active=3, repeat=1" in text
    assert text.count(TABLE_HEADER) + text.count("no finding applies: ") == 1, text


def answers(caplog):
    """The findings blocks shown: each starts with a verdict line."""
    return [m for m in ours(caplog) if m.startswith("lightning-perf: ") and "input-bound - " in m]


def test_one_findings_table_per_fit_with_the_probe_and_without(tmp_path, caplog):
    for mode in ("always", "never"):
        caplog.clear()
        callback = PerfCallback(
            skip_first=2, wait=1, warmup=1, active=2, probe_num_workers=mode, probe_budget_s=2.0
        )
        with caplog.at_level(logging.INFO, logger="lightning_perf"):
            trainer(tmp_path / mode, [callback], limit_train_batches=24).fit(
                TinyModel(), loader(n=96, batch_size=4, delay_s=0.004)
            )
        text = "\n".join(ours(caplog))
        assert len(answers(caplog)) == 1, text
        assert text.count(TABLE_HEADER) == 1, text  # the slow loader is a finding: one table
        assert ("num_workers probe: suggests" in text) == (mode == "always")
        assert ours(caplog)[-1].startswith("lightning-perf: run folder ")


def test_the_console_table_alone_is_unchanged():
    # render_console (also used by `lightning-perf` elsewhere) keeps its one-table shape
    assert render_console([]) == "lightning-perf: no timing data"


def test_a_multi_rank_run_names_every_rank_whose_traces_are_in_the_folder():
    """Rank 0 prints the line while the other ranks write their own traces beside its own."""
    one_rank = traces_phrase(["a.pt.trace.json.gz"], [0], 0)
    assert one_rank == "1 trace (a.pt.trace.json.gz)"
    two_ranks = traces_phrase(["vm_rank0.pt.trace.json.gz"], [0, 1], 0)
    assert two_ranks == "1 trace from each of ranks 0, 1 (rank 0's: vm_rank0.pt.trace.json.gz)"
    assert traces_phrase([], [1, 3], 0) == "the traces of ranks 1, 3 (rank 0 records none)"
    many = traces_phrase(["x", "y", "z"], list(range(16)), 0)
    assert many.startswith("3 traces from each of ranks 0, 1, 2, 3, 4, 5, 6, 7, ... (rank 0's: x, y, ...)")
