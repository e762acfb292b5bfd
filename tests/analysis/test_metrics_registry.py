def test_every_custom_scalars_chart_draws_one_tag_so_each_run_is_one_colour():
    """TensorBoard colours a Custom Scalars chart's lines by run: two tags in one chart drew 6 lines in 3 colours
    for 3 runs (issue 56). Each chart holds one tag; every charted metric, and its slowest rank's, has one."""
    from lightning_perf.analysis.metrics import WINDOW_METRICS, custom_scalars_layout, max_tag

    charts = custom_scalars_layout()["lightning-perf"]
    tags = [regexes for _, regexes in charts.values()]
    assert all(len(regexes) == 1 and "|" not in regexes[0] and "?" not in regexes[0] for regexes in tags), (
        tags
    )
    charted = {regexes[0].strip("^$") for regexes in tags}
    for metric in WINDOW_METRICS:
        if metric.chart is not None:
            assert metric.tag in charted
            assert (max_tag(metric) in charted) == metric.across_ranks
    assert {"step time (ms)", "step time: compute (ms)", "step time, slowest rank (ms)"} <= set(charts)
