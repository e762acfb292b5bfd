"""The libraries that drive Lightning for their users (issue 46): darts, pytorch-forecasting, neuralforecast and
lightly, each with its own small example on synthetic data (examples/ beside this file).

For each: (a) a fit with PerfCallback times its steps; (b) ``tune -- python EXAMPLE.py`` on a loader that waits
4 ms a sample (a sleep: storage) reaches a "faster" verdict with workers and says the change the way that library
takes it. A library that is not installed is skipped by name: ``pip install -e '.[integrations]'``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parent / "examples"
INSTALL = "run `make test-integrations` (a venv of their own) or install the integrations extra: pip install -e '.[integrations]'"
# (module to import, example script): the libraries' own names for the parametrized ids
LIBRARIES = {
    "darts": ("darts", "darts_example.py"),
    "pytorch-forecasting": ("pytorch_forecasting", "forecasting_example.py"),
    "neuralforecast": ("neuralforecast", "neuralforecast_example.py"),
    "lightly": ("lightly", "lightly_example.py"),
}
FIT_STEPS = 20
# the smallest tune that still gives an interval: 3 rounds a candidate (t with 2 degrees of freedom) of 30 steps;
# the loader waits 32 ms a batch at 0 workers, a few ms with workers, so the interval stays far above 1
TUNE_ARGS = ["--steps", "30", "--repeats", "3", "--budget-s", "600", "--format", "json"]
SLEEP_MS = "4"
LIMIT_S = 600


def example(library: str, tmp_path: Path) -> tuple[Path, str]:
    module, script = LIBRARIES[library]
    pytest.importorskip(module, reason=f"{library} is not installed: {INSTALL}")
    project = tmp_path / "project"
    project.mkdir()
    for name in ("sleepy.py", script):
        shutil.copy(EXAMPLES / name, project)
    return project, script


def environment(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


@pytest.mark.once  # the libraries' own code around Lightning: the same on every Lightning of the matrix
@pytest.mark.parametrize("library", list(LIBRARIES))
def test_a_fit_with_perf_callback_times_its_steps(library, tmp_path):
    project, script = example(library, tmp_path)
    perf_dir = tmp_path / "perf"
    # neuralforecast on the one series it ships: one batch an epoch, its windows sampled inside training_step
    extra = {"AIR": "1"} if library == "neuralforecast" else {}
    done = subprocess.run(
        [sys.executable, script, str(FIT_STEPS), "0", str(perf_dir)],
        cwd=project,
        env=environment(**extra),
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "no timing data" not in done.stdout + done.stderr
    summary = json.loads((perf_dir / "perf_summary.json").read_text())
    timing = summary["timing"]
    assert summary["status"] == "finished"
    assert timing["steps"] == FIT_STEPS - 1, timing  # all but the fit's first batch (its start-up)
    step = timing["step_time_ms"]
    assert step["count"] == FIT_STEPS - 1 and 0.0 < step["median"] < 5000.0, step
    assert timing["data_wait_pct"] is not None and 0.0 <= timing["data_wait_pct"] <= 100.0


def digests(root: Path) -> dict[str, str]:
    """The project's files (the runs' own logs under perf_logs/ left out)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.relative_to(root).parts[0] not in ("perf_logs", "__pycache__")
    }


def tune(project: Path, script: str) -> dict | None:
    """tune's JSON answer with a faster winner, the project's files unchanged; None when tune said honestly that
    others' work on the machine disturbed its rounds (checked instead: exit 1, nothing written)."""
    before = digests(project)
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from lightning_perf.cli import main; sys.exit(main())", "tune",
         *TUNE_ARGS, "--", sys.executable, script, "30", SLEEP_MS],
        cwd=project, env=environment(), capture_output=True, text=True, timeout=LIMIT_S,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert digests(project) == before, "tune changed the project's files"
    line = result["decision"]["line"]
    if line.startswith("not measured: the machine was busy (round "):
        assert done.returncode == 1 and result["decision"]["winner"] is None, line
        assert " was disturbed: " in line and result["in_project"] is None, line
        return None
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    winner = result["decision"]["winner"]
    assert winner is not None, line
    speed = next(s for s in result["speeds"] if s["name"] == winner)
    assert speed["significant"] and speed["low"] > 1.0, speed
    assert "faster" in line, line
    return result


def workers_of(result: dict) -> int:
    winner = next(c for c in result["candidates"] if c["name"] == result["decision"]["winner"])
    return int(winner["overrides"]["num_workers"])


# what each library's line says, the winner's worker count in it
SAID = {
    "darts": r'darts builds the training DataLoader \(.*darts.*\): pass dataloader_kwargs=\{"num_workers": (\d+).*\} '
    r"to the model's fit\(\)",
    "pytorch-forecasting": r"pytorch-forecasting builds the training DataLoader \(.*pytorch_forecasting.*\): call the "
    r"dataset's to_dataloader\(num_workers=(\d+)",
    "neuralforecast": r"neuralforecast builds the training DataLoader \(.*neuralforecast.*\): pass "
    r'dataloader_kwargs=\{"num_workers": (\d+).*\} to the model',
    "lightly": r"(?:.*lightly_example\.py):\d+: the DataLoader built here: set num_workers=(\d+)",
}


@pytest.mark.once  # rounds timed by sleeps: the same on every Lightning
@pytest.mark.parametrize("library", list(LIBRARIES))
def test_tune_finds_workers_and_says_them_in_the_librarys_terms(library, tmp_path):
    project, script = example(library, tmp_path)
    result = tune(project, script)
    if result is None:  # the machine was busy: checked in tune()
        return
    workers = workers_of(result)
    # workers of any count: a diagnosis beside others' load reads the step's compute inflated and the loading
    # only "moderately" input-bound, and proposes 1 worker (lightly, load average 4-5: 1.22x faster, 1.07-1.40x)
    assert workers >= 1
    terms = result["in_project"]
    assert terms["kind"] == "code" and terms["files"] == []
    found = [m for m in (re.search(SAID[library], text) for text in terms["lines"]) if m]
    assert found and int(found[0][1]) == workers, terms["lines"]
    if library == "lightly":  # the project builds its own DataLoader: the line is the project's
        site = re.match(r"(.+):(\d+): ", next(t for t in terms["lines"] if "DataLoader" in t))
        assert Path(site[1]) == project / script
        assert "DataLoader(" in (project / script).read_text().splitlines()[int(site[2]) - 1]
