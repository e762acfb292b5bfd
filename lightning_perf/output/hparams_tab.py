"""TensorBoard's HParams tab: the columns that tell the runs apart first, values as they are.

TensorBoard's hparams plugin reads the columns (the experiment) from one ``_hparams_/experiment`` summary, the
first it finds, and each run's values from its own session summaries; it sorts the columns by ``differs``
(True first), then by name, and shows the first five. An experiment written by each run would be the first
run's, written before the others existed. So each run writes its values (:func:`session_summaries`), and one
experiment for all the runs of a log folder (:func:`experiment_summary`, written by
:mod:`lightning_perf.output.hparams_experiment`) marks as ``differs`` the settings and hyperparameters whose
values differ between them, then, up to five columns, the speed settings (``num_workers``, ``precision``,
``batch_size``, ...): what a user sees first is what tells the runs apart. Booleans keep a boolean domain
(``true``/``false``, as ``compare`` says them), versions stay strings, columns and metrics have display names,
and ``hp_metric`` is a metric only when the user logs one: no ``-1`` placeholder.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

PREFIX = "perf/"
# the settings that explain a run's speed, in the order the tab lists them
SPEED_SETTINGS = (
    "num_workers",
    "precision",
    "batch_size",
    "cudnn_benchmark",
    "pin_memory",
    "persistent_workers",
    "prefetch_factor",
    "accumulate_grad_batches",
    "float32_matmul_precision",
    "world_size",
    "devices",
    "strategy",
    "accelerator",
    "gpu_name",
)
# TensorBoard's HParams tab shows this many columns by default: the ``differs`` ones first
SHOWN_COLUMNS = 5
USER_METRIC = "hp_metric"


def ordered(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` with lightning-perf's speed settings first, then the user's own, then the other settings."""
    speed = [PREFIX + name for name in SPEED_SETTINGS if PREFIX + name in params]
    user = [name for name in params if not name.startswith(PREFIX)]
    rest = [name for name in params if name.startswith(PREFIX) and name not in speed]
    return {name: params[name] for name in (*speed, *user, *rest)}


def plain(value: Any) -> bool | float | str:
    """A value TensorBoard keeps as it is: bools stay bools, numbers numbers, anything else its string."""
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        return float(value) if isinstance(value, float) else int(value)
    return str(value)


def session_summaries(values: Mapping[str, bool | float | str]) -> list[Any]:
    """The session start and end summaries of one finished run: its values (as :func:`plain_values` gives them),
    in no session group of its own."""
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
    from tensorboard.plugins.hparams import summary_v2 as hp

    end = plugin_data_pb2.SessionEndInfo(status=api_pb2.STATUS_SUCCESS, end_time_secs=time.time())
    return [
        _summary(hp, metadata.SESSION_START_INFO_TAG, session_start_info=_start(plugin_data_pb2, values)),
        hp._summary_pb(
            metadata.SESSION_END_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_end_info=end)
        ),
    ]


def plain_values(params: Mapping[str, Any]) -> dict[str, bool | float | str]:
    """``params`` in the tab's order, as the tab keeps them; no None."""
    return {name: plain(value) for name, value in ordered(params).items() if value is not None}


def column_names(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every name any of ``runs`` has, in the order first seen."""
    return list(dict.fromkeys(name for run in runs for name in run))


def default_columns(runs: Sequence[Mapping[str, Any]], names: Sequence[str] | None = None) -> set[str]:
    """The columns marked ``differs``: those whose values differ between ``runs`` (absent in some counts), then
    the speed settings, in their order, up to :data:`SHOWN_COLUMNS` in all (``names``: :func:`column_names`,
    where the caller has them)."""
    names = column_names(runs) if names is None else names
    differing = {name for name in names if len({repr(run.get(name)) for run in runs}) > 1}
    room = SHOWN_COLUMNS - len(differing)
    speed = [PREFIX + n for n in SPEED_SETTINGS if PREFIX + n in names and PREFIX + n not in differing]
    return differing | set(speed[: max(room, 0)])


def experiment_summary(
    runs: Sequence[Mapping[str, Any]], metric_tags: Sequence[str], metric_names: Mapping[str, tuple[str, str]]
) -> Any:
    """The experiment of the runs of one log folder (``runs``: each one's values as :func:`plain_values` gives
    them): every column any run has, :func:`default_columns` marked ``differs``; ``metric_names``: a tag's
    display name and description."""
    from tensorboard.plugins.hparams import api_pb2, metadata
    from tensorboard.plugins.hparams import summary_v2 as hp

    names = column_names(runs)
    shown = default_columns(runs, names)
    columns: dict[str, bool | float | str] = {}
    for name in names:
        values = [run[name] for run in runs if name in run]
        # the column's type from its values; values of mixed kinds make a column of strings
        columns[name] = values[0] if len({_kind(v) for v in values}) == 1 else str(values[0])
    infos = [_info(api_pb2, name, value, name in shown) for name, value in ordered(columns).items()]
    metrics = []
    for tag in dict.fromkeys(metric_tags):
        display, description = metric_names.get(tag, ("", ""))
        metrics.append(
            api_pb2.MetricInfo(
                name=api_pb2.MetricName(tag=tag), display_name=display, description=description
            )
        )
    experiment = api_pb2.Experiment(hparam_infos=infos, metric_infos=metrics, time_created_secs=time.time())
    return _summary(hp, metadata.EXPERIMENT_TAG, experiment=experiment)


def _kind(value: Any) -> str:
    return "bool" if isinstance(value, bool) else "str" if isinstance(value, str) else "number"


def _summary(hp: Any, tag: str, **data: Any) -> Any:
    from tensorboard.plugins.hparams import plugin_data_pb2

    return hp._summary_pb(tag, plugin_data_pb2.HParamsPluginData(**data))


def _start(plugin_data_pb2: Any, values: Mapping[str, bool | float | str]) -> Any:
    """The session's values, in no session group of its own: the tab names the session by its run."""
    start = plugin_data_pb2.SessionStartInfo(start_time_secs=time.time())
    for name, value in values.items():
        if isinstance(value, bool):
            start.hparams[name].bool_value = value
        elif isinstance(value, str):
            start.hparams[name].string_value = value
        else:
            start.hparams[name].number_value = value
    return start


def _info(api_pb2: Any, name: str, value: bool | float | str, differs: bool) -> Any:
    display = name[len(PREFIX) :] if name.startswith(PREFIX) else name
    info = api_pb2.HParamInfo(name=name, display_name=display, differs=differs)
    if isinstance(value, bool):
        info.type = api_pb2.DATA_TYPE_BOOL
        info.domain_discrete.extend([False, True])
    elif isinstance(value, str):
        info.type = api_pb2.DATA_TYPE_STRING
    else:
        info.type = api_pb2.DATA_TYPE_FLOAT64
    return info


def user_logs_hp_metric(trainer: Any) -> bool:
    """Whether the user logged ``hp_metric`` themselves (the metric Lightning's placeholder stood for)."""
    return any(
        USER_METRIC in (getattr(trainer, name, None) or {}) for name in ("logged_metrics", "callback_metrics")
    )
