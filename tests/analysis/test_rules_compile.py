"""The torch.compile rules over summaries: guard texts as dynamo 2.14 words them (copied from real runs)."""

from __future__ import annotations

import json

import pytest

from lightning_perf.analysis.compile_summary import CompileEvent, CompileSummary
from lightning_perf.analysis.diagnosis import SETTING_TARGETS, diagnose
from lightning_perf.analysis.rules.compile import cause_of, describe_site, graph_breaks, recompilation
from lightning_perf.analysis.summary import RunSummary, Settings, TimingSummary

SIZE = "0/0: tensor 'batch[0]' size mismatch at index 0. expected 4, actual 5"
SEQUENCE = "2/0: tensor 'x' size mismatch at index 1. expected 128, actual 97"
INT_ATTRIBUTE = (
    "4/0: self.seen_batches == 0                                   # self.seen_batches += 1  # "
    "tests/helpers.py:68 in training_step (HINT: torch.compile considers integer attributes of the nn.Module "
    "to be static. If you are observing recompilation, you might want to make this integer dynamic using "
    "torch._dynamo.config.allow_unspec_int_on_nn_module = True, or convert this integer into a tensor.)"
)
LIGHTNING_STAGE = (
    "1/1: ___check_obj_id(self._trainer.state.stage, 140105380209616), type=<class "
    "'lightning.pytorch.trainer.states.RunningStage'>  # return self.state.stage == RunningStage.TRAINING"
)
PRINT_BREAK = (
    "Failed to trace builtin operator Explanation: Dynamo does not know how to trace builtin operator `print` "
    "with argument types ['str'] (has_kwargs True)"
)
LOG_BREAK = (
    "Skip inlining `torch.compiler.disable()`d function Explanation: Skip inlining function <function "
    "_ResultCollection.log at 0x7f6cd359e0c0> since it was wrapped with `torch.compiler.disable` (reason: None)"
)


def compiled(
    reasons: list[str], *, steps: list[int] | None = None, seconds: float = 0.1, **kw
) -> CompileSummary:
    steps = steps or list(range(1, len(reasons) + 1))
    events = [CompileEvent("0/0", 0, "train", seconds)]
    events += [
        CompileEvent(f"0/{i + 1}", step, "train", seconds, "training_step", reason)
        for i, (reason, step) in enumerate(zip(reasons, steps, strict=True))
    ]
    return CompileSummary(
        compiles=len(events),
        recompiles=len(reasons),
        total_s=seconds * len(events),
        longest_s=seconds,
        events=events,
        **kw,
    )


def summary_with(
    comp: CompileSummary | None, wall_s: float = 100.0, per_epoch: int | None = None
) -> RunSummary:
    return RunSummary(
        timing=TimingSummary(steps=100, train_wall_s=wall_s),
        settings=Settings(train_batches_per_epoch=per_epoch),
        compile=comp,
    )


@pytest.mark.parametrize(
    "reason, kind",
    [(SIZE, "size"), (SEQUENCE, "size"), (INT_ATTRIBUTE, "int_attribute"), (LIGHTNING_STAGE, "mode")],
)
def test_guards_are_read_as_their_cause(reason, kind):
    assert cause_of(reason).kind == kind


def test_a_varying_batch_size_asks_for_dynamic_shapes():
    sizes = [
        f"0/{i}: tensor 'batch[0]' size mismatch at index 0. expected {4 + i}, actual {5 + i}"
        for i in range(4)
    ]
    finding = recompilation(summary_with(compiled(sizes)), None)

    assert finding.id == "recompilation" and finding.severity == "medium"
    assert "sizes 4, 5, 6, 7, 8" in finding.evidence and "4 after warm-up" in finding.evidence
    assert "torch._dynamo.mark_dynamic(batch[0], 0)" in finding.recommendation
    assert set(finding.settings_change) <= set(SETTING_TARGETS)


def test_a_varying_sequence_length_asks_for_padding_or_bucketing():
    finding = recompilation(summary_with(compiled([SEQUENCE, SEQUENCE.replace("97", "64")])), None)

    assert "dimension 1 of `x` varies" in finding.evidence
    assert "bucketing" in finding.recommendation and "mark_dynamic(x, 1)" in finding.recommendation


def test_a_short_batch_that_is_not_at_the_epoch_end_is_not_called_the_last_batch():
    short = "0/0: tensor 'batch[0]' size mismatch at index 0. expected 4, actual 2"
    at_end = recompilation(summary_with(compiled([short], steps=[4]), per_epoch=5), None)
    mid_epoch = recompilation(summary_with(compiled([short], steps=[2]), per_epoch=5), None)

    assert at_end.settings_change == {"drop_last": True} and at_end.severity == "low"
    assert mid_epoch.settings_change == {"dynamic": True}


def test_an_int_attribute_is_named_with_its_fix():
    finding = recompilation(summary_with(compiled([INT_ATTRIBUTE] * 3)), None)

    assert "`self.seen_batches` is a Python int" in finding.evidence
    assert "allow_unspec_int_on_nn_module" in finding.recommendation


def test_mode_switches_are_warm_up_unless_they_cost_a_large_share():
    cheap = summary_with(compiled([LIGHTNING_STAGE], seconds=0.1), wall_s=100.0)
    costly = summary_with(compiled([LIGHTNING_STAGE], seconds=20.0), wall_s=60.0)

    assert recompilation(cheap, None) is None
    finding = recompilation(costly, None)
    assert finding.severity == "low" and "0 after warm-up" in finding.evidence
    assert "num_sanity_val_steps=0" in finding.recommendation


def test_the_recompile_limit_is_high_severity():
    finding = recompilation(summary_with(compiled([SIZE], recompile_limit_hit=True)), None)
    assert finding.severity == "high" and "recompile limit" in finding.evidence


def test_graph_breaks_name_torchs_reason_and_where_the_code_resumed():
    comp = compiled(
        [],
        graphs=5,
        graph_breaks=6,
        break_reasons={PRINT_BREAK: 4, LOG_BREAK: 2},
        break_sites={"torch_dynamo_resume_in_forward_at_12": 4},
    )
    finding = graph_breaks(summary_with(comp), None)

    assert finding.severity == "medium" and "into 5 graphs" in finding.evidence
    assert "`print`" in finding.evidence and "forward, line 12 (4x)" in finding.evidence
    assert "Lightning's own `self.log`" in finding.evidence
    assert describe_site("torch_dynamo_resume_in_training_step_at_74") == "training_step, line 74"


def test_lightnings_own_log_breaks_alone_are_no_finding():
    comp = compiled([], graphs=2, graph_breaks=1, break_reasons={LOG_BREAK: 1})
    assert graph_breaks(summary_with(comp), None) is None


# as Lightning 2.4 (which lets dynamo into self.log) words them, from a real run on 2.4.0
TORCHMETRICS_GUARD = (
    "12/1: name == 'value'  # setattr(self, name, default)  # torchmetrics/metric.py:280 in add_state"
)
PARTIAL_BREAK = (
    "Unsupported method call Explanation: Dynamo does not know how to trace method `__setstate__` of class "
    "`partial`"
)


def test_breaks_and_recompiles_inside_lightnings_logging_are_told_apart_from_the_models():
    comp = compiled(
        [TORCHMETRICS_GUARD, TORCHMETRICS_GUARD],
        graphs=12,
        graph_breaks=10,
        break_reasons={PARTIAL_BREAK: 10},
        break_sites={
            "torch_dynamo_resume_in_add_state_at_282": 2,
            "torch_dynamo_resume_in_training_step_at_17": 1,
        },
        lightning_sites=["torch_dynamo_resume_in_add_state_at_282"],
    )
    for event in comp.events[1:]:
        event.in_lightning = True  # compiled from torchmetrics/metric.py
    summary = summary_with(comp, wall_s=0.5)  # compiling is most of this short run

    breaks = graph_breaks(summary, None)
    assert breaks.severity == "low" and breaks.title.endswith("in Lightning's own logging")
    assert "1 of the 2 places" in breaks.evidence and "add_state, line 282" in breaks.evidence
    assert "lightning>=2.5" in breaks.recommendation
    recompiles = recompilation(summary, None)  # not the model's: no "high", no fix for the model
    assert recompiles.severity == "low" and "0 after warm-up" in recompiles.evidence
    assert "Lightning's own logging" in recompiles.evidence and recompiles.settings_change == {}
    # the same guard in the model's own code is the model's
    for event in comp.events[1:]:
        event.in_lightning = False
    assert recompilation(summary, None).severity == "high"


def test_the_compile_section_round_trips_and_older_summaries_still_load():
    summary = summary_with(compiled([SIZE], recompile_limit_hit=True, graphs=2, graph_breaks=0))
    summary.findings = diagnose(summary)
    loaded = RunSummary.from_dict(json.loads(json.dumps(summary.to_dict())))
    assert loaded.compile == summary.compile and loaded.findings == summary.findings

    older = summary.to_dict()
    del older["compile"]
    assert RunSummary.from_dict(older).compile is None
    assert not [f for f in diagnose(RunSummary.from_dict(older)) if f.id in ("recompilation", "graph_breaks")]
