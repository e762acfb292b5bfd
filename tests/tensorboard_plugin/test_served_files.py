"""What the Perf tab serves, over HTTP from a real `tensorboard`: only regular files inside each run folder (a
symlink out to a secret or to /proc/self/environ, a symlinked run folder, a FIFO are neither listed nor read, and
no answer ever holds the secret), and one bad file costs its own row, never the tab (a summary nested 100,000
deep, one of the wrong types, one over the size bound, a million samples, a broken comparison.json)."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import uuid

import pytest

from lightning_perf.analysis.summary import MAX_SAMPLES, MAX_SUMMARY_BYTES, RunSummary
from lightning_perf.output.hparams_experiment import VALUES_FILENAME
from tests.tensorboard_plugin.test_routes import answer
from tests.tensorboard_server import TensorBoardServer

SECRET = f"lp-secret-{uuid.uuid4().hex}"
ENV_NAME = "LIGHTNING_PERF_TEST_SECRET"
# The run folder's entries the tab must refuse: symlinks out (a text file, a trace by name and by content,
# /proc/self/environ), FIFOs (by name a trace, a JSON file, a text file), a symlinked folder.
REFUSED = [
    "leak.txt",
    "environ.txt",
    "stolen.pt.trace.json",
    "stolen.json",
    "pipe.pt.trace.json",
    "pipe.json",
    "pipe.txt",
    "linked_folder",
]
DEEP = 100_000
MILLION = 1_000_000


def _summary_text(perf_runs) -> str:
    return (perf_runs / "exp" / "workers0" / "perf_summary.json").read_text()


def _hostile_run(folder, outside) -> None:
    """A healthy run folder, plus every kind of entry the tab must not follow."""
    (folder / "leak.txt").symlink_to(outside / "secret.txt")
    (folder / "environ.txt").symlink_to("/proc/self/environ")
    (folder / "stolen.pt.trace.json").symlink_to(outside / "secret.pt.trace.json")
    (folder / "stolen.json").symlink_to(outside / "secret.pt.trace.json")
    for name in ("pipe.pt.trace.json", "pipe.json", "pipe.txt"):
        os.mkfifo(folder / name)
    (folder / "linked_folder").symlink_to(outside, target_is_directory=True)
    (folder / "notes.txt").write_text("kept beside the run\n")
    (folder / "alias.txt").symlink_to("notes.txt")  # a symlink to a file beside it stays inside: served


@pytest.fixture(scope="module")
def tab_root(perf_runs, tmp_path_factory):
    """A log root of healthy runs with hostile entries, bad summaries and bad comparisons, and a folder
    outside it holding the secret (as a file, inside a trace, in a run and in a comparison)."""
    base = tmp_path_factory.mktemp("served_files")
    root, outside = base / "logs", base / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET + "\n")
    good, good2 = perf_runs / "exp" / "workers0", perf_runs / "exp" / "workers2"
    (trace,) = [p for p in good.iterdir() if ".pt.trace.json" in p.name]
    text = gzip.decompress(trace.read_bytes()).decode() if trace.suffix == ".gz" else trace.read_text()
    secret_event = (
        f'{{"ph": "X", "cat": "cpu_op", "name": "{SECRET}", "pid": 1, "tid": 1, "ts": 1, "dur": 1}}, '
    )
    (outside / "secret.pt.trace.json").write_text(
        text.replace('"traceEvents": [', '"traceEvents": [' + secret_event, 1)
    )
    assert SECRET in (outside / "secret.pt.trace.json").read_text()
    shutil.copytree(good, outside / "run")
    comparison = json.loads((perf_runs / "exp" / "comparison.json").read_text())
    (outside / "comparison.json").write_text(json.dumps({**comparison, "verdict": SECRET}))

    shutil.copytree(good, root / "exp" / "good")
    _hostile_run(root / "exp" / "good", outside)
    shutil.copytree(good2, root / "exp" / "good2")
    (root / "exp" / "good2" / "hparams.yaml").unlink()
    os.mkfifo(root / "exp" / "good2" / "hparams.yaml")  # compare reads the runs' hyperparameters
    (root / "exp" / "linked").symlink_to(outside / "run", target_is_directory=True)
    (root / "exp" / "summary_link").mkdir()
    (root / "exp" / "summary_link" / "perf_summary.json").symlink_to(outside / "run" / "perf_summary.json")
    os.mkfifo(
        root / "exp" / "summary_link" / VALUES_FILENAME
    )  # the run list reads every run's HParams values
    (root / "exp" / "summary_fifo").mkdir()
    os.mkfifo(root / "exp" / "summary_fifo" / "perf_summary.json")

    summary = json.loads(_summary_text(perf_runs))
    bad = {
        "deep": "[" * DEEP + "]" * DEEP,
        "deep_field": json.dumps({**summary, "probes": {}}).replace(
            '"probes": {}', '"probes": ' + "[" * DEEP + "]" * DEEP
        ),
        "wrong_types": json.dumps(
            {**summary, "world_size": "two", "timing": {**summary["timing"], "steps": "many"}}
        ),
        # what the run list reads is right, what the Overview reads is not: a row with figures, a 422 pane
        "wrong_types_deep": json.dumps({**summary, "utilization": [1, 2], "ranks": {"0": "fast"}}),
        "huge": " " * (MAX_SUMMARY_BYTES + 1) + "{}",
    }
    for name, content in bad.items():
        (root / "exp" / name).mkdir()
        (root / "exp" / name / "perf_summary.json").write_text(content)
    samples = [1.5] * MILLION
    million = {
        **summary,
        "timing": {
            **summary["timing"],
            "steps": MILLION,
            "step_samples_ms": samples,
            "wait_samples_ms": samples,
        },
    }
    (root / "exp" / "million").mkdir()
    (root / "exp" / "million" / "perf_summary.json").write_text(json.dumps(million))

    trials = {
        "good": comparison,
        "deep": "[" * DEEP + "]" * DEEP,
        "wrong_types": {**comparison, "settings_diff": {"num_workers": 3}},
    }
    for name, content in trials.items():
        (root / "trials" / name).mkdir(parents=True)
        text = content if isinstance(content, str) else json.dumps(content)
        (root / "trials" / name / "comparison.json").write_text(text)
    (root / "trials" / "linked").mkdir()
    (root / "trials" / "linked" / "comparison.json").symlink_to(outside / "comparison.json")
    (root / "trials" / "fifo").mkdir()
    os.mkfifo(root / "trials" / "fifo" / "comparison.json")
    return root


@pytest.fixture(scope="module")
def tab(tab_root):
    """A real ``tensorboard`` on the hostile log root, with the secret in its environment too."""
    os.environ[ENV_NAME] = SECRET  # /proc/self/environ read by the server would hold it
    try:
        server = TensorBoardServer(str(tab_root))
    finally:
        del os.environ[ENV_NAME]
    try:
        server.wait_for("/data/plugins_listing", lambda r: r.get("lightning_perf", {}).get("enabled"))
        yield server
    finally:
        server.close()


def fetch(server, route: str, **params: str) -> tuple[int, bytes]:
    status, body = answer(server, route, list(params.items()))
    assert SECRET.encode() not in body, f"{route} {params} served the secret"
    return status, body


def test_refused_entries_are_neither_listed_nor_served(tab):
    status, body = fetch(tab, "/overview", run="exp/good")
    assert status == 200, body[:500]
    data = json.loads(body)
    listed = {f["file"] for f in data["files"]}
    assert {"perf_summary.json", "notes.txt", "alias.txt"} <= listed
    assert listed.isdisjoint(REFUSED)
    (trace,) = data["traces"]  # the run's own trace only
    assert trace["file"] not in REFUSED
    for name in REFUSED:
        for route in ("/file", "/speedscope", "/trace"):
            status, body = fetch(tab, route, run="exp/good", file=name)
            assert status == 404, (route, name, body[:300])
            assert name in body.decode() and "\n" not in body.decode().strip(), body
    for name, why in [
        ("leak.txt", "outside the run folder"),
        ("environ.txt", "outside"),
        ("pipe.txt", "a FIFO"),
    ]:
        assert why in fetch(tab, "/file", run="exp/good", file=name)[1].decode()
    status, body = fetch(tab, "/file", run="exp/good", file="alias.txt")
    assert status == 200 and body == b"kept beside the run\n"
    status, body = fetch(tab, "/trace_ranks", run="exp/good")
    assert status == 200, body[:500]
    data = json.loads(body)
    assert [t["file"] for t in data["traces"]] == [trace["file"]]
    assert data["unreadable"] == []  # the FIFO named like a trace is not even named


def test_a_symlinked_run_folder_or_summary_is_not_read(tab):
    status, body = fetch(tab, "/runs")
    assert status == 200, body[:500]
    rows = {row["name"]: row for row in json.loads(body)["runs"]}
    assert "exp/linked" not in rows  # a run reached through a symlinked folder
    assert "outside the run folder" in rows["exp/summary_link"]["error"]
    assert "a FIFO" in rows["exp/summary_fifo"]["error"]
    assert fetch(tab, "/overview", run="exp/linked")[0] == 404
    status, body = fetch(tab, "/overview", run="exp/summary_link")
    assert status == 404 and b"outside the run folder" in body
    assert fetch(tab, "/overview", run="exp/summary_fifo")[0] == 404
    assert fetch(tab, "/trace_ranks", run="exp/summary_fifo")[0] == 404
    for other in ("exp/summary_link", "exp/summary_fifo"):
        params = [("run", "exp/good"), ("run", other), ("baseline", "exp/good")]
        status, body = answer(tab, "/compare", params)
        assert status == 404 and SECRET.encode() not in body
    # a FIFO for hparams.yaml: the runs compare without its hyperparameters, nothing hangs
    params = [("run", "exp/good"), ("run", "exp/good2"), ("baseline", "exp/good")]
    status, body = answer(tab, "/compare", params)
    assert status == 200, body[:500]
    assert json.loads(body)["settings_diff"]["num_workers"] == [0, 2]


def test_one_bad_summary_costs_its_row_not_the_run_list(tab, tab_root):
    status, body = fetch(tab, "/runs")
    assert status == 200, body[:500]
    rows = {row["name"]: row for row in json.loads(body)["runs"]}
    healthy = RunSummary.load(tab_root / "exp" / "good")
    assert rows["exp/good"]["steps"] == healthy.timing.steps > 0
    assert rows["exp/good"]["step_time_ms_mean"] == healthy.timing.step_time_ms.mean
    for name, why in [
        ("deep", "not a readable run summary"),  # a typed decode stops at the first `[`
        ("deep_field", "nested too deeply"),
        ("wrong_types", "Expected `int`, got `str`"),
        ("huge", f"over {MAX_SUMMARY_BYTES >> 20} MiB"),
    ]:
        assert why in rows[f"exp/{name}"]["error"], rows[f"exp/{name}"]
        status, body = fetch(tab, "/overview", run=f"exp/{name}")
        assert status == 422 and b"perf_summary.json" in body, body[:300]
    assert rows["exp/wrong_types_deep"]["steps"] == healthy.timing.steps
    status, body = fetch(tab, "/overview", run="exp/wrong_types_deep")
    assert status == 422 and re.search(rb"utilization: expected an object", body), body[:300]
    assert rows["exp/million"]["steps"] == MILLION


def test_a_million_samples_reach_the_page_thinned_as_the_writer_thins_them(tab):
    status, body = fetch(tab, "/overview", run="exp/million")
    assert status == 200, body[:300]
    series = json.loads(body)["series"]
    assert 0 < len(series["step_ms"]) == len(series["wait_ms"]) <= MAX_SAMPLES
    assert series["every"] * len(series["step_ms"]) >= MILLION
    assert set(series["step_ms"]) == {1.5}


def test_one_bad_comparison_costs_its_row_not_the_trials(tab):
    status, body = fetch(tab, "/trials")
    assert status == 200, body[:500]
    trials = {t["name"]: t for t in json.loads(body)["trials"]}
    assert (
        trials["trials/good"]["run_names"] == ["workers0", "workers2"]
        and "error" not in trials["trials/good"]
    )
    assert "nested too deeply" in trials["trials/deep"]["error"]
    assert "malformed comparison" in trials["trials/wrong_types"]["error"]
    assert "outside the run folder" in trials["trials/linked"]["error"]
    assert "a FIFO" in trials["trials/fifo"]["error"]
