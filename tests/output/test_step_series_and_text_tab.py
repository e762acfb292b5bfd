"""The pieces behind a TensorBoard that reads right: the step series' bound and order, the Text tab rewrite."""

from tensorboard import plugin_util

from lightning_perf.analysis.markdown import for_text_tab
from lightning_perf.collect.steps.step_series import StepSeries


def test_a_long_run_is_evenly_thinned_and_keeps_its_windows():
    series = StepSeries(max_points=200)
    for window in range(1, 101):  # 100 windows of 1,000 steps
        series.add_window([float(window)] * 1000, [0.5] * 1000, [8] * 1000, window * 1000)
        series.window_logged(window * 1000, {"perf_step/time_ms": float(window)})
    points = series.points()
    assert len(points) <= 200
    steps = [p.step for p in points]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    assert {p.step for p in points if p.logged} == {w * 1000 for w in range(1, 101)}
    gaps = [b - a for a, b in zip(steps, steps[1:], strict=False)]
    assert max(gaps) <= 3 * min(g for g in gaps if g) + 1000  # evenly spread over the run


def test_more_windows_than_points_need_no_series():
    series = StepSeries(max_points=10)
    for window in range(1, 20):
        series.add_window([1.0], [0.0], [-1], window)
        series.window_logged(window, {"perf_step/time_ms": 1.0})
    assert series.points() == []


def test_gradient_accumulation_merges_steps_into_their_global_step():
    series = StepSeries()
    series.add_window([1.0, 3.0, 5.0, 7.0, 2.0, 2.0], [0.0] * 6, [4] * 6, 3)  # 2 batches per optimizer step
    series.window_logged(3, {"perf_step/time_ms": 3.3})
    assert [(p.step, p.step_ms, p.samples) for p in series.points() if not p.logged] == [
        (1, 2.0, 4),
        (2, 6.0, 4),
    ]


def test_text_tab_markdown_keeps_paragraphs_lists_arrows_and_short_cells():
    markdown = (
        "**Verdict:** faster; data wait 92.1% -> 79.5%\n"
        "_method: one_\n_how to read: two_\n"
        "- a list right after a line\n"
        "| name | evidence |\n|---|---|\n"
        + "".join(f"| `row_{i}` | {'a long explanation with many words ' * 4}|\n" for i in range(2))
        + "\nkeep `a->b` in code\n"
    )
    html = plugin_util.markdown_to_safe_html(for_text_tab(markdown))
    assert "92.1% → 79.5%" in html and "<code>a-&gt;b</code>" in html
    assert "<p><em>method: one</em></p>" in html and "<p><em>how to read: two</em></p>" in html
    assert "<li>a list right after a line</li>" in html
    assert "<td><code>row_0</code></td>" in html and "<li>evidence: a long explanation" in html
