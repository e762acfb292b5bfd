"""PerfConfig: every PerfCallback argument checked once, errors naming the argument, the value and the rule."""

from __future__ import annotations

import math

import pytest

from lightning_perf.collect.config import PerfConfig
from lightning_perf.errors import ConfigError, LightningPerfError

BOOLS = ["record_shapes", "profile_memory", "with_stack", "with_flops", "export_stacks", "enable_profiler",
         "export_speedscope", "export_memory_timeline", "utilization", "diagnose", "ab_cudnn_benchmark",
         "log_hparams", "profile_on_slowdown"]  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(log_min_interval_s=math.inf), "`log_min_interval_s` must be a finite number of seconds >= 0"),
        (dict(log_min_interval_s=1e308), "`log_min_interval_s` must be .* <= 86400, got 1e\\+308"),
        (dict(max_trace_mb=math.inf), "`max_trace_mb` must be a finite number of megabytes > 0"),
        (dict(max_trace_mb=-1), "`max_trace_mb` .*got -1"),
        (dict(probe_budget_s=math.inf), "`probe_budget_s` must be a finite number of seconds > 0"),
        (dict(probe_budget_s=math.nan), "`probe_budget_s` .*got nan"),
        (dict(util_interval_s=0), "`util_interval_s` .*> 0"),
        (dict(dirpath=""), "`dirpath` must be a non-empty path, or None"),
        (dict(dirpath=3), "`dirpath` .*got 3"),
        (dict(record_shapes="no"), "`record_shapes` must be True or False, got 'no'"),
        (dict(activities=5), "`activities` must be a list of .*got 5"),
        (dict(activities=[5]), "`activities` entry 5 is not one of"),
        (dict(active=-1), "`active` must be an integer >= 1 \\(batches recorded per cycle\\), got -1"),
        (dict(repeat=-1), "`repeat` must be an integer >= 0"),
        (dict(wait=1.5), "`wait` must be an integer >= 0, got 1.5"),
        (dict(batch_size=True), "`batch_size` must be an integer >= 1, or None, got True"),
        (dict(log_every_n_steps=0), "`log_every_n_steps` .*got 0"),
        (dict(probe_num_workers=["auto"]), "`probe_num_workers` must be one of 'auto'"),
    ],
)
def test_bad_argument_is_named_with_its_value_and_the_rule(kwargs, message):
    with pytest.raises(ConfigError, match=message) as info:
        PerfConfig(**kwargs)
    assert isinstance(info.value, LightningPerfError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("name", BOOLS)
@pytest.mark.parametrize("value", [0, 1, "yes", None])
def test_flags_take_only_booleans(name, value):
    with pytest.raises(ConfigError, match=f"`{name}` must be True or False"):
        PerfConfig(**{name: value})


def test_edges_that_are_allowed():
    config = PerfConfig(log_min_interval_s=0, max_trace_mb=1e9, probe_budget_s=3600, activities="CPU")
    assert config.activities == ("cpu",) and config.log_min_interval_s == 0.0
    assert isinstance(config.max_trace_bytes, int)
