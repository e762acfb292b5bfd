"""The Perf tab's routes, served by a real `tensorboard` on real runs (tiny fits and a two-process DDP fit): what
each pane gets is what the summaries, `lightning-perf report` and `lightning-perf compare` say."""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.parse
import urllib.request

import pytest

from lightning_perf.analysis.rules.thresholds import VERDICTS
from lightning_perf.analysis.summary import RunSummary, SummaryError
from lightning_perf.cli import main as cli_main
from lightning_perf.tensorboard_plugin import runs
from lightning_perf.traces.exports import SPEEDSCOPE_SCHEMA

ROUTE = "/data/plugin/lightning_perf"
RUNS = ["exp/workers0", "exp/workers2", "exp/ddp2"]


def answer(server, route: str, params: list[tuple[str, str]] | None = None) -> tuple[int, bytes]:
    """HTTP status and body of a plugin route (errors included, unlike TensorBoardServer.get)."""
    url = f"http://127.0.0.1:{server.port}{ROUTE}{route}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def pane(server, route: str, **params: str) -> dict:
    status, body = answer(server, route, list(params.items()))
    assert status == 200, body[:500]
    return json.loads(body)


def cli_json(capsys, *args: str) -> dict:
    capsys.readouterr()
    assert cli_main(list(args)) in (0, 1)
    return json.loads(capsys.readouterr().out)


def test_the_tab_is_listed_as_an_iframe_module_beside_the_profiler_tab(perf_server):
    listing = perf_server.get("/data/plugins_listing")
    perf = listing["lightning_perf"]
    assert perf["enabled"] and perf["tab_name"] == "Perf"
    assert perf["loading_mechanism"] == {"type": "IFRAME", "module_path": f"{ROUTE}/index.js"}
    assert "pytorch_profiler" in listing  # torch-tb-profiler, installed beside it, is still loaded
    for name in ("index.js", "index.html", "perf.js", "perf.css"):
        status, body = answer(perf_server, f"/{name}")
        assert status == 200 and body
    # the page loads nothing from elsewhere: every script and style it names is one of ours
    _, html = answer(perf_server, "/index.html")
    assert b"http" not in html


def test_runs_lists_every_run_with_its_summary_verdict(perf_server, perf_runs):
    listed = {r["name"]: r for r in pane(perf_server, "/runs")["runs"]}
    assert sorted(listed) == sorted(RUNS)
    for name in RUNS:
        summary = RunSummary.load(perf_runs / name)
        (verdict,) = [f for f in summary.findings if f.id == "input_bound"]
        assert listed[name]["verdict"] in VERDICTS and listed[name]["verdict"] in verdict.title
        assert listed[name]["steps"] == summary.timing.steps > 0
        assert listed[name]["step_time_ms_mean"] == summary.timing.step_time_ms.mean
    assert listed["exp/ddp2"]["world_size"] == 2
    # each run named by what tells it apart (its HParams values against the others')
    assert (
        "num_workers=2" in listed["exp/workers2"]["label"]
        and "num_workers=0" in listed["exp/workers0"]["label"]
    )
    assert "world_size=2" in listed["exp/ddp2"]["label"] and "world_size" in listed["exp/workers0"]["label"]


def test_overview_has_the_findings_steps_probe_and_files(perf_server, perf_runs):
    data = pane(perf_server, "/overview", run="exp/workers0")
    summary = RunSummary.load(perf_runs / "exp" / "workers0")
    assert data["verdict"]["verdict"] == "highly input-bound"  # 3 ms a sample asleep, in the training thread
    assert [(f["id"], f["evidence"]) for f in data["findings"]] == [
        (f.id, f.evidence) for f in summary.findings
    ]
    # each settings change as the user writes it (`num_workers=4, persistent_workers=True`)
    for shown, finding in zip(data["findings"], summary.findings, strict=True):
        assert shown["change"] == ", ".join(f"{k}={v!r}" for k, v in finding.settings_change.items())
    series = data["series"]
    assert len(series["step_ms"]) == len(series["wait_ms"]) == summary.timing.steps
    assert all(0 <= wait <= step for wait, step in zip(series["wait_ms"], series["step_ms"], strict=True))
    probe = data["num_workers_probe"]
    assert [c["num_workers"] for c in probe["candidates"]][:2] == [0, 1]
    kinds = {f["file"]: f["kind"] for f in data["files"]}
    assert kinds["perf_summary.json"] == "file"
    (trace,) = data["traces"]
    assert kinds[trace["file"]] == "trace" and trace["steps"] == summary.traces[0].steps
    status, body = answer(perf_server, "/file", [("run", "exp/workers0"), ("file", trace["file"])])
    assert status == 200 and body == (perf_runs / "exp" / "workers0" / trace["file"]).read_bytes()
    assert data["memory"]["steps"] == summary.memory.steps
    parts = {p["part"]: p["ms"] for p in data["anatomy"]["parts"]}
    assert parts == summary.anatomy.parts_ms
    assert data["memory"]["process_rss_mb"] == summary.memory.process_rss_mb


def test_a_trace_pane_is_the_report_of_that_trace(perf_server, perf_runs, capsys):
    run_dir = perf_runs / "exp" / "workers2"
    (trace,) = pane(perf_server, "/overview", run="exp/workers2")["traces"]
    data = pane(perf_server, "/trace", run="exp/workers2", file=trace["file"])
    (section,) = cli_json(capsys, "report", str(run_dir), "--format", "json")["traces"]
    assert data["steps"] == section["steps"] and data["average"] == section["average"]
    top = len(section["top_cpu_operators"])
    assert top > 0 and data["top_cpu_operators"][:top] == section["top_cpu_operators"]
    assert {"name", "calls", "self_ms", "total_ms"} <= set(data["top_cpu_operators"][0])


def test_a_trace_downloads_as_a_speedscope_file(perf_server):
    (trace,) = pane(perf_server, "/overview", run="exp/workers2")["traces"]
    status, body = answer(perf_server, "/speedscope", [("run", "exp/workers2"), ("file", trace["file"])])
    assert status == 200
    exported = json.loads(body)
    assert exported["$schema"] == SPEEDSCOPE_SCHEMA
    names = {frame["name"] for frame in exported["shared"]["frames"]}
    assert any(name.startswith("ProfilerStep#") for name in names)


def test_a_trial_shows_its_saved_comparison(perf_server, perf_runs):
    (trial,) = pane(perf_server, "/trials")["trials"]
    saved = json.loads((perf_runs / "exp" / "comparison.json").read_text())
    assert trial["name"] == "exp"
    assert trial["verdict"] == saved["verdict"] and trial["rounds"] == saved["rounds"] == 1
    assert trial["run_names"] == ["workers0", "workers2"]
    assert set(trial["cells"]) == {m["key"] for m in saved["metrics"]}


def test_a_ddp_run_shows_its_ranks_and_the_straggler(perf_server, perf_runs):
    data = pane(perf_server, "/overview", run="exp/ddp2")
    assert [r["rank"] for r in data["ranks"]["rows"]] == [0, 1]
    summary = RunSummary.load(perf_runs / "exp" / "ddp2")
    (straggler,) = [f for f in summary.findings if f.id == "straggler"]
    assert f"rank {data['ranks']['straggler']['rank']}" in straggler.title
    assert len(data["traces"]) == 2
    traced = pane(perf_server, "/trace_ranks", run="exp/ddp2")
    assert [row["rank"] for row in traced["ranks"]["rows"]] == [0, 1]
    assert sorted(t["rank"] for t in traced["traces"]) == [0, 1]
    assert traced["unreadable"] == []


def test_compare_is_what_the_compare_command_says(perf_server, perf_runs, capsys):
    runs = [("run", "exp/workers0"), ("run", "exp/workers2"), ("baseline", "exp/workers0")]
    status, body = answer(perf_server, "/compare", runs)
    assert status == 200, body[:500]
    data = json.loads(body)
    cells = data.pop("cells")
    expected = cli_json(
        capsys,
        "compare",
        str(perf_runs / "exp" / "workers0"),
        str(perf_runs / "exp" / "workers2"),
        "--format",
        "json",
        "--no-tensorboard",
        "--label",
        "exp/workers0",
        "--label",
        "exp/workers2",
    )
    assert data == expected
    assert data["settings_diff"]["num_workers"] == [0, 2]
    # two workers sleep side by side: the comparison finds them faster, and says so in the verdict
    assert data["changes"]["exp/workers2"]["verdict"] == "faster"
    assert data["verdict"].startswith("exp/workers2 is ")
    assert set(cells) == {m["key"] for m in data["metrics"]}
    assert all(len(row) == 2 for row in cells.values())


def test_bad_requests_are_answered_with_the_reason(perf_server):
    status, body = answer(perf_server, "/overview", [("run", "exp/nope")])
    assert status == 404 and b"exp/nope" in body
    status, body = answer(
        perf_server, "/trace", [("run", "exp/workers0"), ("file", "../workers2/hparams.yaml")]
    )
    assert status == 404
    status, body = answer(perf_server, "/file", [("run", "exp/workers0"), ("file", "/etc/passwd")])
    assert status == 404
    status, body = answer(perf_server, "/compare", [("run", "exp/workers0"), ("baseline", "exp/workers0")])
    assert status == 422 and b"two runs" in body
    status, body = answer(perf_server, "/overview")
    assert status == 400 and b"run" in body


def test_a_corrupt_summary_is_listed_with_why_and_the_others_still_shown(perf_runs, tmp_path):
    shutil.copytree(perf_runs / "exp" / "workers2", tmp_path / "exp" / "good")
    (tmp_path / "exp" / "bad").mkdir()
    text = (perf_runs / "exp" / "workers0" / "perf_summary.json").read_text()
    (tmp_path / "exp" / "bad" / "perf_summary.json").write_text(text[: len(text) // 2])  # cut mid-write
    rows = {row["name"]: row for row in runs.run_list(str(tmp_path))}
    assert "perf_summary.json" in rows["exp/bad"]["error"] and "verdict" not in rows["exp/bad"]
    assert rows["exp/good"]["verdict"] in VERDICTS
    with pytest.raises(SummaryError, match="exp/bad/perf_summary.json"):
        runs.overview(str(tmp_path), "exp/bad")
