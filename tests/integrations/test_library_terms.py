"""The winner said the way each library takes it, from the facts a diagnosis round saw (no library needed)."""

from __future__ import annotations

from lightning_perf.trial.project.library_terms import library_lines, package_of
from lightning_perf.trial.project.terms import in_project_terms

SITE = "/venv/lib/python3.11/site-packages"


def facts(
    site: str, cls: str = "torch.utils.data.dataloader.DataLoader", trainer_site: str | None = None
) -> dict:
    loader = {"num_workers": 0, "batch_size": 8, "class": cls, "site": site}
    return {"loaders": [loader], "trainer_site": trainer_site, "argv": ["train.py", "--fast"]}


def lines(found: dict, changes: dict) -> list[str]:
    """What the library says, then the plain code lines for the rest (as terms.in_project_terms joins them)."""
    said = library_lines(found, changes)
    assert said is not None
    return said[0] + [f"left: {key}" for key in said[1]]


def test_darts_takes_dataloader_kwargs_in_fit_and_its_trainer_settings_in_pl_trainer_kwargs():
    darts = f"{SITE}/darts/models/forecasting/torch_forecasting_model.py"
    said = lines(
        facts(f"{darts}:1261", trainer_site=f"{darts}:542"),
        {"num_workers": 4, "persistent_workers": True, "precision": "bf16-mixed"},
    )
    assert said[0] == (
        f'train.py: darts builds the training DataLoader ({darts}:1261): pass dataloader_kwargs={{"num_workers": 4, '
        '"persistent_workers": True} to the model\'s fit() (darts versions before dataloader_kwargs: '
        "num_loader_workers=4)"
    )
    assert (
        said[1]
        == 'train.py: darts builds the Trainer: pass pl_trainer_kwargs={"precision": "bf16-mixed"} to the model'
    )
    assert len(said) == 2


def test_pytorch_forecasting_takes_to_dataloader_arguments_and_the_users_trainer_keeps_its_line():
    # in_project_terms (terms.py) joins the library's lines and the plain code lines of the rest
    site = f"{SITE}/pytorch_forecasting/data/timeseries/_timeseries.py:2000"
    said = lines(facts(site, trainer_site="/p/train.py:30"), {"num_workers": 4, "benchmark": True})
    assert said[0].endswith("pytorch-forecasting builds the training DataLoader (" + site + "): call the "
                            "dataset's to_dataloader(num_workers=4)")  # fmt: skip
    assert said[1] == "left: benchmark"  # the project's own Trainer: its own line
    assert in_project_terms(
        facts(site, trainer_site="/p/train.py:30"), {"benchmark": True}, "unused"
    ).lines == ["/p/train.py:30: the Trainer built here: set benchmark=True"]


def test_neuralforecast_is_found_by_its_loader_class_and_takes_the_models_dataloader_kwargs():
    said = lines(
        facts("/src/neuralforecast/tsdataset.py:643", "neuralforecast.tsdataset.TimeSeriesLoader"),
        {"num_workers": 2},
    )
    assert said == [
        "train.py: neuralforecast builds the training DataLoader (/src/neuralforecast/tsdataset.py:643): pass "
        'dataloader_kwargs={"num_workers": 2} to the model (e.g. MLP(..., dataloader_kwargs=...))'
    ]


def test_another_installed_library_is_named_and_a_project_of_its_own_keeps_the_line_that_builds_it():
    said = lines(facts(f"{SITE}/somelib/data.py:12"), {"num_workers": 4})
    assert said == [f"train.py: somelib builds the training DataLoader ({SITE}/somelib/data.py:12): pass it the "
                    "DataLoader's num_workers=4"]  # fmt: skip
    assert library_lines(facts("/p/train.py:20"), {"num_workers": 4}) is None
    assert in_project_terms(facts("/p/train.py:20"), {"num_workers": 4}, "unused").lines == [
        "/p/train.py:20: the DataLoader built here: set num_workers=4"
    ]
    assert package_of("/home/me/site-packages-notes/darts/train.py:3") is None
    assert package_of(None) is None
