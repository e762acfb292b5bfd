"""The report's PNG numbers its step bars as the report's text does (ProfilerStep#N, e.g. 7-9), not 1-3."""

import lightning as L

from lightning_perf import PerfCallback
from lightning_perf.cli import main
from lightning_perf.output.trace_chart import chart_figure
from lightning_perf.traces.report.build import build_report
from tests.helpers import TinyModel, loader, trainer


def test_png_step_numbers_are_the_texts(tmp_path, capsys):
    callback = PerfCallback(skip_first=5, wait=1, warmup=1, active=3, probe_num_workers="never")
    fitted: L.Trainer = trainer(tmp_path, [callback], limit_train_batches=16)
    fitted.fit(TinyModel(), loader(n=64))
    run_dir = fitted.logger.log_dir
    report = build_report(run_dir)
    (trace,) = report["traces"]
    text_steps = [str(step["step"]) for step in trace["steps"]]
    assert text_steps == ["7", "8", "9"]
    # the chart `report --png` draws from the same sections
    figure = chart_figure([(trace["file"], trace["figures"])])
    bars = figure.axes[0]
    assert [label.get_text() for label in bars.get_xticklabels()] == text_steps
    # a CPU run's chart has no empty GPU panel beside its steps (issue 56); a GPU trace's keeps it
    assert len(figure.axes) == 1
    with_gpu = dict(trace["figures"], idle_pct=10.0, compute_pct=85.0, non_compute_pct=5.0)
    assert [a.get_title() for a in chart_figure([("gpu", with_gpu)]).axes][1] == "GPU timeline (%)"
    # the summary's own figures (TensorBoard's Images tab) carry the same numbers
    assert callback.last_summary.trace_figures[0].step_numbers == [7, 8, 9]
    # and the command writes the PNG
    png = tmp_path / "chart.png"
    assert main(["report", run_dir, "--png", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "7 " in capsys.readouterr().out
