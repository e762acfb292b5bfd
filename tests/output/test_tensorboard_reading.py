"""A new user's TensorBoard, read back the way TensorBoard reads it (issue 37): a short run's charts hold its
steps, Custom Scalars charts hold one unit each, the Text tab renders the Markdown as written, HParams shows the
speed settings first with their values as they are, one diagnosis per run, and a rerun `compare` replaces its
own output."""

import glob
import os
import re

import pytest
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard import plugin_util
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.hparams import api_pb2, metadata

from lightning_perf import PerfCallback
from lightning_perf.analysis import metrics
from lightning_perf.cli import main as cli_main
from tests.helpers import TinyModel, loader, trainer

STEPS = 64


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """Two 64-step fits at Lightning's default log_every_n_steps=50, then `lightning-perf compare` twice."""
    root = tmp_path_factory.mktemp("runs")
    for workers in (0, 2):
        logger = TensorBoardLogger(str(root), name="exp", version=f"workers{workers}")
        callback = PerfCallback(enable_profiler=False, probe_num_workers="never")
        trainer(root, [callback], logger=logger, limit_train_batches=STEPS, log_every_n_steps=50).fit(
            TinyModel(), loader(n=4 * STEPS, delay_s=0.002, num_workers=workers)
        )
    for _ in range(2):
        assert cli_main(["compare", str(root / "exp"), "--format", "json"]) == 0
    return root / "exp"


def accumulator(run_dir):
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0, "images": 0})
    events.Reload()
    return events


def texts(run_dir, tag):
    return [
        e.tensor_proto.string_val[0].decode() for e in accumulator(run_dir).Tensors(tag + "/text_summary")
    ]


def hparams_data(run_dir):
    found = {}
    for path in glob.glob(os.path.join(run_dir, "events.out.tfevents.*")):
        for event in EventFileLoader(path).Load():
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == metadata.PLUGIN_NAME:
                    found[value.tag] = value.metadata.plugin_data.content
    return found


def test_a_short_run_charts_every_step_once_in_step_order(root):
    events = accumulator(root / "workers2")
    for tag in (metrics.STEP_TIME.tag, metrics.DATA_WAIT_PCT.tag, metrics.SAMPLES_PER_SEC.tag):
        points = events.Scalars(tag)
        by_step = {}
        for point in points:
            by_step.setdefault(point.step, set()).add(point.value)
        assert len(by_step) >= 30, (tag, sorted(by_step))
        assert max(by_step) == STEPS
        assert all(len(values) == 1 for values in by_step.values())  # a window's point rewritten as logged
        # after the windows' live points, the series in step order (TensorBoard's data server keeps it whole)
        tail = [p.step for p in points[-len(by_step) :]]
        assert tail == sorted(by_step)


def test_summary_figures_draw_a_line_not_a_lone_point(root):
    points = accumulator(root / "workers0").Scalars("perf_summary/step_time_mean_ms")
    assert [p.step for p in points] == [0, STEPS] and points[0].value == points[1].value


def unit(metric):
    """A chart's axis: rates by what they count (samples/s and batches/s are both "1/s" in the registry)."""
    return metric.name.split("_per_")[0] + "/s" if "_per_sec" in metric.name else metric.unit


def test_each_custom_scalars_chart_has_one_unit(root):
    (event,) = accumulator(root / "workers0").Tensors("custom_scalars__config__")
    layout = layout_pb2.Layout.FromString(event.tensor_proto.string_val[0])
    charts = [chart for category in layout.category for chart in category.chart]
    assert len(charts) >= 5
    for chart in charts:
        patterns = chart.multiline.tag
        # a chart draws a metric, or its slowest rank's value under DDP (``<tag>_max``)
        drawn = [
            m
            for m in metrics.WINDOW_METRICS
            if any(
                re.match(p, m.tag) or (m.across_ranks and re.match(p, metrics.max_tag(m))) for p in patterns
            )
        ]
        assert drawn and len({unit(m) for m in drawn}) == 1, (chart.title, [m.tag for m in drawn])
        assert chart.title.endswith(")"), chart.title  # its unit in the title


def cells(html):
    for cell in re.findall(r"<t[dh]>(.*?)</t[dh]>", html, re.S):
        yield from (re.sub(r"<[^>]+>", "", line) for line in cell.split("<br>"))


def assert_renders_as_written(html):
    assert "-&gt;" not in html and "&gt; " not in html  # arrows intact, no stray quote
    assert "<table>" in html and "<code>" in html
    long = [c for c in cells(html) if len(c) > 40]
    assert not long, long


def test_diagnosis_renders_in_the_text_tab_as_written(root):
    (markdown,) = texts(root / "workers2", metrics.DIAGNOSIS_TEXT.tag)  # one diagnosis per run
    html = plugin_util.markdown_to_safe_html(markdown)
    assert_renders_as_written(html)
    assert "<ul>" in html and "<li>Recommendation:" in html  # the long columns listed under the table
    assert "<p>Run:" in html  # its own paragraph, not run into the verdict's


def test_comparison_renders_in_the_text_tab_as_written(root):
    (markdown,) = texts(root / "perf_compare", metrics.COMPARISON_TEXT.tag)  # compare twice: one text
    html = plugin_util.markdown_to_safe_html(markdown)
    assert_renders_as_written(html)
    assert "→" in html
    assert re.search(r"<p><em>method:.*?</em></p>\s*<p><em>how to read:", html, re.S)


def test_a_rerun_compare_replaces_its_own_output(root):
    assert len(glob.glob(str(root / "perf_compare" / "events.out.tfevents.*"))) == 1
    assert len(accumulator(root / "perf_compare").Images(metrics.COMPARISON_CHART.tag)) == 1


def test_hparams_what_differs_then_speed_settings_first_values_as_they_are(root):
    assert metadata.EXPERIMENT_TAG not in hparams_data(root / "workers2")  # one experiment, for both runs
    data = hparams_data(root / "workers2")
    experiment = metadata.parse_experiment_plugin_data(hparams_data(root)[metadata.EXPERIMENT_TAG])
    names = [info.name for info in experiment.hparam_infos]
    assert names[:3] == ["perf/num_workers", "perf/precision", "perf/batch_size"]
    # TensorBoard sorts the `differs` columns first and shows five: what differs, then the speed settings
    shown = {name for _, name in sorted((not i.differs, i.name) for i in experiment.hparam_infos)[:5]}
    assert "perf/num_workers" in shown and {"perf/precision", "perf/batch_size"} <= shown
    infos = {info.name: info for info in experiment.hparam_infos}
    assert infos["perf/pin_memory"].type == api_pb2.DATA_TYPE_BOOL
    assert infos["perf/num_workers"].display_name == "num_workers"
    assert "perf/cuda_version" not in infos  # a CPU run
    start = metadata.parse_session_start_info_plugin_data(data[metadata.SESSION_START_INFO_TAG])
    assert start.hparams["perf/pin_memory"].WhichOneof("kind") == "bool_value"
    assert start.hparams["perf/num_workers"].number_value == 2
    metric = next(m for m in experiment.metric_infos if m.name.tag == "perf_summary/data_wait_pct")
    assert metric.display_name == "data wait (%)" and "DataLoader wait" in metric.description
    tags = [m.name.tag for m in experiment.metric_infos]
    assert "perf_summary/step_time_mean_ms" in tags and "hp_metric" not in tags
    assert "hp_metric" not in accumulator(root / "workers2").Tags()["scalars"]
