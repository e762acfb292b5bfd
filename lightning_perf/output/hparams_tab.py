"""TensorBoard's HParams tab for one run: the settings that explain speed first, values as they are.

TensorBoard's hparams plugin reads the experiment (its columns) from the ``_hparams_/experiment`` summary and
sorts the columns by ``differs`` (True first), then by name, and shows the first few by default. So the
experiment written here lists the speed-relevant settings first and marks :data:`SHOWN` as ``differs``: those
are the columns a new user sees (``batch_size``, ``cudnn_benchmark``, ``num_workers``, ``pin_memory``,
``precision``), the rest one click away. Booleans keep a boolean domain (``true``/``false``, as ``compare``
says them), versions stay strings, and ``hp_metric`` is a metric only when the user logs one: no ``-1``
placeholder.
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
# the columns shown by default: TensorBoard shows ``differs`` columns first (see the module docstring)
SHOWN = frozenset(PREFIX + name for name in SPEED_SETTINGS[:5])
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


def summaries(params: Mapping[str, Any], metric_tags: Sequence[str]) -> list[Any]:
    """The experiment, session start and session end summaries of one finished run."""
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
    from tensorboard.plugins.hparams import summary_v2 as hp

    values = {name: plain(value) for name, value in ordered(params).items() if value is not None}
    infos = [_info(api_pb2, name, value) for name, value in values.items()]
    experiment = api_pb2.Experiment(
        hparam_infos=infos,
        metric_infos=[api_pb2.MetricInfo(name=api_pb2.MetricName(tag=tag)) for tag in metric_tags],
        time_created_secs=time.time(),
    )
    end = plugin_data_pb2.SessionEndInfo(status=api_pb2.STATUS_SUCCESS, end_time_secs=time.time())
    return [
        _summary(hp, metadata.EXPERIMENT_TAG, experiment=experiment),
        _summary(hp, metadata.SESSION_START_INFO_TAG, session_start_info=_start(plugin_data_pb2, values)),
        hp._summary_pb(
            metadata.SESSION_END_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_end_info=end)
        ),
    ]


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


def _info(api_pb2: Any, name: str, value: bool | float | str) -> Any:
    info = api_pb2.HParamInfo(name=name, differs=name in SHOWN)
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
