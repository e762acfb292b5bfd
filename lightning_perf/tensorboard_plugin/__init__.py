"""TensorBoard's Perf tab: a plugin (``tensorboard_plugins`` entry point) that shows each lightning-perf run's
``perf_summary.json`` (verdict, findings, step time, utilization, the num_workers probe, files), its traces'
operator, kernel and step tables read with the project's own reader, the per-rank table of a distributed run,
and runs compared as ``lightning-perf compare`` compares them.

:mod:`.runs` and :mod:`.panes` build each pane's JSON from the files (no TensorBoard import), reading only what
:mod:`.safe_files` allows (regular files inside a run folder: no symlink out, no FIFO);
:mod:`.plugin` serves them and the static page in ``static/`` (plain HTML, JS and CSS: no CDN, no build step).
"""
