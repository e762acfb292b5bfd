"""Names that vulture (`make lint`: ``vulture lightning_perf vulture_whitelist.py --min-confidence 80``) reports as
unused but a framework reads: listed here, vulture counts them as used. Never imported or run.

Only names a framework uses belong here (Lightning's hooks, TensorBoard's plugin methods, fields msgspec reads):
code that nothing calls is deleted, not listed.
"""

from types import SimpleNamespace

_ = SimpleNamespace()

USED_BY_FRAMEWORKS = (
    # the arguments Lightning passes its Callback hooks by position: a hook takes them whether it reads them or
    # not (PerfCallback, the trial worker's and the loss recorder's on_train_batch_end, on_save_checkpoint)
    _.batch_idx,
    _.checkpoint,
)
