"""``lightning-perf tune`` as a stage of its own: a project (a Lightning CLI config, or the user's training
command) diagnosed, its candidates measured by the trial stage below, the winner written in the project's terms.
The stage imports :mod:`lightning_perf.trial`; the trial stage never imports it."""
