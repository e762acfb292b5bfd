"""Compute fixes measured like workers (issue 44): the compute settings a finding proposes, each its own candidate;
their values checked by name; applied to the model and optimizers at run time; the winner in the project's terms;
the rounds' loss and compile time beside the speed."""

from __future__ import annotations

import json

import pytest
import torch
from lightning.pytorch import LightningModule

from lightning_perf.analysis.compile_summary import CompileSummary
from lightning_perf.analysis.findings_render import render_console
from lightning_perf.analysis.summary import Finding, RunSummary, Settings
from lightning_perf.trial.compute.apply import fit_arguments, optimizers_in, step_kind
from lightning_perf.trial.compute.figures import (
    LOSS_FILENAME,
    RoundFigures,
    beside,
    figures_lines,
    variant_figures,
)
from lightning_perf.trial.project.command import RUNTIME_TARGETS, parse_settings
from lightning_perf.trial.project.terms import in_project_terms
from lightning_perf.trial.proposals import COMBINED, SEMANTIC_LABEL, propose
from lightning_perf.trial.spec import TrialError, TrialResult, VariantResult

LOW_MFU = {"precision": "bf16-mixed", "compile": True, "channels_last": True}


def finding(id_: str, change: dict, severity: str = "medium") -> Finding:
    return Finding(id_, severity, f"title of {id_}", "evidence", f"do {id_}", change)


def test_each_compute_setting_of_a_finding_is_its_own_candidate_then_their_combination():
    findings = [finding("low_mfu", LOW_MFU), finding("optimizer_share", {"fused_optimizer": True})]
    proposal = propose(findings, Settings(precision="32-true"), RUNTIME_TARGETS, allow_semantic=True)
    assert [(c.name, c.label, c.semantic) for c in proposal.candidates] == [
        ("precision_bf16-mixed", f"precision=bf16-mixed ({SEMANTIC_LABEL})", True),
        ("torch.compile", "torch.compile", False),
        ("channels_last", "channels_last", False),
        ("fused_optimizer", "fused_optimizer", False),
        (
            COMBINED,
            f"precision=bf16-mixed + torch.compile + channels_last + fused_optimizer ({SEMANTIC_LABEL})",
            True,
        ),
    ]
    assert proposal.candidates[1].overrides == [("compile", "true")]
    assert proposal.candidates[-1].findings == ["low_mfu", "optimizer_share"]  # each finding once
    # lower precision for a full-precision run only when allowed; the rest is tried
    strict = propose(findings[:1], Settings(precision="32-true"), RUNTIME_TARGETS)
    assert [c.name for c in strict.candidates] == ["torch.compile", "channels_last", COMBINED]
    assert [(u.change, u.reason.split(";")[0]) for u in strict.unapplied] == [
        ({"precision": "bf16-mixed"}, SEMANTIC_LABEL)
    ]
    # TF32 matmuls for a run that asked for fp32 ones are a semantic change too
    tf32 = propose([finding("low_mfu", {"matmul_precision": "high"})], Settings(), RUNTIME_TARGETS)
    assert tf32.candidates == [] and SEMANTIC_LABEL in tf32.unapplied[0].reason


def test_a_config_tune_applies_compile_by_the_models_argument_and_names_the_command_for_the_rest():
    targets = {"loader_keys": {}, "compile": "model.init_args.compile", "compile_on": False}
    change = {"compile": True, "channels_last": True}
    proposal = propose([finding("low_mfu", change)], Settings(), targets)
    # one compile candidate (the finding's, by the model's argument), not a second one for the argument
    assert [(c.label, c.overrides) for c in proposal.candidates] == [
        ("torch.compile", [("model.init_args.compile", "true")])
    ]
    (channels,) = [u for u in proposal.unapplied if "channels_last" in u.change]
    assert channels.reason.startswith("not in the config: applied at run time by tune with your command")


def test_compute_settings_are_checked_by_name_with_what_is_allowed():
    assert parse_settings("c", [("compile", "true"), ("matmul_precision", "high")], "--variant") == {
        "compile": True,
        "matmul_precision": "high",
    }
    with pytest.raises(
        TrialError, match=r"--variant 'c': matmul_precision must be one of highest, high, medium"
    ):
        parse_settings("c", [("matmul_precision", "low")], "--variant")
    with pytest.raises(TrialError, match=r"--variant 'c': channels_last must be true or false, got 2"):
        parse_settings("c", [("channels_last", "2")], "--variant")
    with pytest.raises(TrialError, match="fused_optimizer"):  # the list of settings names the new ones
        parse_settings("c", [("fused", "true")], "--variant")


FACTS = {
    "trainer_site": "/p/train.py:40",
    "compute": {
        "script": "/p/train.py",
        "fit_site": "/p/train.py:41",
        "model": {"class": "train.SmallCNN", "site": "/p/train.py:9"},
        "optimizers": [{"class": "torch.optim.AdamW", "site": "/p/train.py:30", "step": "fused"}],
    },
}


@pytest.mark.parametrize(
    ("change", "lines"),
    [
        ({"precision": "bf16-mixed"}, ['/p/train.py:40: the Trainer built here: set precision="bf16-mixed"']),
        (
            {"matmul_precision": "high"},
            ['/p/train.py: at the top of the script: torch.set_float32_matmul_precision("high")'],
        ),
        (
            {"compile": True},
            ["/p/train.py:41: compile the model before the fit: model = torch.compile(model)"],
        ),
        (
            {"channels_last": True},
            [
                "/p/train.py:41: before the fit: model = model.to(memory_format=torch.channels_last)",
                "/p/train.py:9: give the batches' images the same format in on_after_batch_transfer: "
                "images.contiguous(memory_format=torch.channels_last)",
            ],
        ),
        ({"fused_optimizer": True}, ["/p/train.py:30: torch.optim.AdamW(..., fused=True)"]),
    ],
)
def test_each_compute_winner_is_written_where_the_project_sets_it(tmp_path, change, lines):
    assert in_project_terms(FACTS, change, str(tmp_path)).lines == lines


class Net(LightningModule):
    def __init__(self, optimizer: str = "AdamW") -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.optimizer = optimizer

    def forward(self, x):
        return self.conv(x)

    def configure_optimizers(self):
        optimizer = getattr(torch.optim, self.optimizer)(self.parameters(), lr=0.1)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1)}


def test_the_compute_settings_reach_the_model_its_batches_and_its_optimizer(monkeypatch):
    monkeypatch.setenv("LIGHTNING_PERF_COMPILE_BACKEND", "eager")
    before = torch.get_float32_matmul_precision()
    model = Net()
    settings = {"channels_last": True, "fused_optimizer": True, "compile": True, "matmul_precision": "high"}
    try:
        args, kwargs = fit_arguments(settings, (), {"model": model, "ckpt_path": None})
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)
    assert kwargs["ckpt_path"] is None and kwargs["model"] is not model  # compiled, handed to fit
    assert kwargs["model"]._orig_mod is model
    assert model.conv.weight.is_contiguous(memory_format=torch.channels_last)
    images, labels = model.on_after_batch_transfer((torch.randn(2, 3, 5, 5), torch.zeros(2)), 0)
    assert images.is_contiguous(memory_format=torch.channels_last) and labels.shape == (2,)
    returned = model.configure_optimizers()
    (optimizer,) = optimizers_in(returned)
    assert returned["lr_scheduler"].optimizer is optimizer  # the scheduler still steps the same optimizer
    assert all(
        g["fused"] is True and g["foreach"] is False for g in optimizer.param_groups
    )  # CPU AdamW: fused
    model(torch.randn(1, 3, 5, 5)).sum().backward()
    optimizer.step()  # the fused kernel runs


def test_an_optimizer_without_a_fused_kernel_steps_with_foreach_or_is_left_alone():
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert step_kind(torch.optim.Adamax(params)) == "foreach"  # no fused Adamax in torch
    assert step_kind(torch.optim.LBFGS(params)) is None
    assert step_kind(torch.optim.AdamW(params)) == "fused"
    # settings a round does not ask for leave fit's arguments as they were
    model = Net()
    assert fit_arguments({"num_workers": 2}, (model, None), {}) == ((model, None), {})


def test_the_loss_and_compile_time_of_the_rounds_stand_beside_the_speed(tmp_path):
    dirs = []
    for i, mean in enumerate((2.0, 2.2)):
        folder = tmp_path / f"round_{i}"
        folder.mkdir()
        (folder / LOSS_FILENAME).write_text(
            json.dumps({"steps": 10, "mean": mean, "first": 2.5, "last": 1.5})
        )
        dirs.append(str(folder))
    rounds = [RunSummary(run_name="r", compile=CompileSummary(compiles=2, total_s=s)) for s in (3.0, 1.0)]
    variant = VariantResult("torch.compile", "", status="ok", rounds=rounds, round_dirs=dirs)
    figures = {"torch.compile": variant_figures(variant), "baseline": RoundFigures(loss=2.05, loss_rounds=2)}
    assert figures["torch.compile"] == RoundFigures(loss=2.1, last_loss=1.5, loss_rounds=2, compile_s=2.0)
    assert beside(figures, "torch.compile", "baseline") == (
        "; mean loss 2.1 (baseline 2.05); compile 2.0 s a round, not in the step times"
    )
    # a trial's report says the same for every variant
    trial = TrialResult("t", "", 10, [VariantResult("baseline", "", status="ok"), variant])
    assert figures_lines(trial) == [
        "mean training loss over the rounds: torch.compile 2.1",
        "torch.compile a round (not in the step times): torch.compile 2.0 s",
    ]
    assert beside({"x": RoundFigures(loss=float("nan"))}, "x", "baseline") == (
        "; mean loss nan (not finite: training diverged)"
    )


def test_the_end_of_fit_table_says_what_to_do_for_a_compute_setting_not_set_compile():
    low = finding("low_mfu", LOW_MFU)
    text = render_console([low], head="head")
    assert "do low_mfu" in text and "compile=True" not in text
