"""The Perf tab as a person sees it: a real `tensorboard` on a log root of two fits (num_workers 0 and 2), a
two-process DDP fit and a 16-rank folder made from a real trace, opened in headless Chromium (npm's
@sparticuz/chromium, driven by puppeteer-core: perf_tab_browser.mjs). Screenshots are kept in the test's tmp dir
(the path is printed)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lightning_perf.analysis.compute.anatomy import PART_LABELS
from lightning_perf.analysis.rules.thresholds import VERDICTS
from lightning_perf.analysis.summary import RunSummary
from lightning_perf.tensorboard_plugin.runs import run_dirs
from lightning_perf.traces.report.build import analyse_trace
from tests.tensorboard_plugin.many_ranks import build_many_ranks
from tests.tensorboard_server import TensorBoardServer

SCRIPT = Path(__file__).with_name("perf_tab_browser.mjs")
# the rank of the 16 whose trace is stretched in time
SLOW_RANK = 9
PACKAGES = ("@sparticuz/chromium", "puppeteer-core")
# where the npm packages are installed once, outside the checkout (a Chromium is ~70 MB)
BROWSER_DIR = Path(
    os.environ.get("LIGHTNING_PERF_BROWSER_DIR", Path.home() / ".cache" / "lightning-perf-browser")
)


@pytest.fixture(scope="session")
def browser_dir() -> Path:
    """The npm packages, installed from the npm registry on first use; a skip naming why when that cannot be."""
    if all((BROWSER_DIR / "node_modules" / name / "package.json").exists() for name in PACKAGES):
        return BROWSER_DIR
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is None or node is None:
        pytest.skip("no node/npm on PATH: the headless Chromium comes from the npm registry")
    try:
        done = subprocess.run(
            [npm, "install", "--prefix", str(BROWSER_DIR), *PACKAGES],
            capture_output=True,
            text=True,
            timeout=600,
        )
    except subprocess.TimeoutExpired:
        pytest.skip("npm install of the headless Chromium took over 10 minutes (no registry reachable?)")
    if done.returncode != 0:
        pytest.skip(f"npm install of the headless Chromium failed: {done.stderr.strip()[-600:]}")
    return BROWSER_DIR


def verdict_words(summary: RunSummary) -> str:
    (finding,) = [f for f in summary.findings if f.id == "input_bound"]
    return next(v for v in VERDICTS if v in finding.title)


def table_with(pane: dict, column: str) -> dict:
    """The pane's first table with a column of that header."""
    return next(t for t in pane["tables"] if column in t["header"])


def column(table: dict, name: str) -> list[str]:
    index = table["header"].index(name)
    return [row[index] for row in table["rows"]]


def straggler_rank(summary: RunSummary) -> int:
    (finding,) = [f for f in summary.findings if f.id == "straggler"]
    return int(re.search(r"rank (\d+)", finding.title).group(1))


@pytest.mark.once  # a browser: its subject does not change with Lightning's version
@pytest.mark.timeout(600)
def test_the_perf_tab_in_headless_chromium(perf_runs, realtraces, browser_dir, tmp_path):
    root = tmp_path / "logs"
    for run in ("workers0", "workers2", "ddp2"):
        shutil.copytree(perf_runs / "exp" / run, root / "exp" / run)
    shutil.copy(perf_runs / "exp" / "comparison.json", root / "exp")  # a trial's saved comparison
    many = build_many_ranks(root / "exp" / "many16", realtraces, ranks=16, slow_rank=SLOW_RANK)
    # kept where CI collects them when it says so (pytest's tmp dirs are pruned after a few sessions)
    shots = Path(os.environ.get("LIGHTNING_PERF_SCREENSHOTS", tmp_path / "screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    plan = {
        "ddp": "exp/ddp2",
        "many": "exp/many16",
        "timed": "exp/workers2",
        "compare": {"baseline": "exp/workers0", "runs": ["exp/workers0", "exp/workers2"]},
    }
    server = TensorBoardServer(str(root))
    try:
        server.wait_for("/data/plugins_listing", lambda r: r.get("lightning_perf", {}).get("enabled"))
        done = subprocess.run(
            [
                "node",
                str(SCRIPT),
                str(browser_dir),
                f"http://127.0.0.1:{server.port}",
                str(shots),
                json.dumps(plan),
            ],
            capture_output=True,
            text=True,
            timeout=480,
        )
    finally:
        server.close()
    print(f"Perf tab screenshots: {shots}")
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"timings: {seen['timings']}")

    assert seen["consoleErrors"] == []
    assert seen["external"] == []  # nothing left the machine
    assert all(Path(p).stat().st_size > 0 for p in seen["screenshots"])
    assert seen["runs"] == list(run_dirs(str(root)))

    # each run's Overview: its verdict with the evidence, one row a finding
    for run in seen["runs"]:
        summary = RunSummary.load(root / run)
        shown = seen["panes"][f"overview {run}"]
        assert f"Verdict: {verdict_words(summary)}" in shown["text"]
        (verdict,) = [f for f in summary.findings if f.id == "input_bound"]
        assert verdict.evidence in shown["text"]
        assert column(table_with(shown, "finding"), "finding") == [f.title for f in summary.findings]
        if summary.anatomy is not None:  # where the mean step goes, part by part
            assert column(table_with(shown, "ms a step"), "part")[: len(summary.anatomy.parts_ms)] == [
                PART_LABELS[part] for part in summary.anatomy.parts_ms
            ]
            # the bar has a legend naming its parts, and its steps are named apart from the clock's
            shown_parts = [
                PART_LABELS[p] for p in summary.anatomy.parts_ms if summary.anatomy.share_pct(p) > 0
            ]
            assert all(f"{label} " in shown["text"] for label in shown_parts), shown["text"]
            assert f"hooks timed on {summary.anatomy.steps} steps" in shown["text"]
    probe = RunSummary.load(root / "exp" / "workers0").probes.num_workers
    assert probe is not None
    probe_table = table_with(seen["panes"]["overview exp/workers0"], "batches/s")
    assert column(probe_table, "num_workers") == [str(c["num_workers"]) for c in probe.candidates]

    # a trace's operators, the report's own, by self time; one click sorts them by calls
    traces = seen["panes"]["traces"]
    (trace,) = [p for p in (root / "exp" / "workers2").iterdir() if p.name.endswith(".pt.trace.json.gz")]
    operators = analyse_trace(str(trace), top=100)["top_cpu_operators"]
    by_self = sorted(operators, key=lambda o: -o["self_ms"])
    assert column(table_with(traces, "self ms"), "name") == [o["name"] for o in by_self]
    assert column(table_with(traces, "step ms"), "step")[-1] == "average"
    calls = [
        int(c.replace(",", ""))
        for c in column(table_with(seen["panes"]["traces_by_calls"], "self ms"), "calls")
    ]
    assert calls == sorted(calls, reverse=True) and len(calls) == len(operators)

    # the DDP run: both ranks, the straggler its diagnosis names marked in the table from its timing
    ranks = seen["panes"]["ranks"]
    timed = table_with(ranks, "DataLoader wait ms")
    slow = straggler_rank(RunSummary.load(root / "exp" / "ddp2"))
    assert column(timed, "rank") == ["0", "1"]
    assert [row[-1] for row in timed["rows"]] == ["straggler" if r == slow else "" for r in (0, 1)]
    assert column(table_with(ranks, "trace"), "rank") == ["0", "1"]

    # the two fits compared: the run with workers named faster, the setting that differs shown
    compare = seen["panes"]["compare"]
    assert re.match(r"exp/workers2 is [\d.]+x faster than exp/workers0", compare["verdict"])
    assert ["num_workers", "0", "2"] in [row[:3] for t in compare["tables"] for row in t["rows"]]
    saved = json.loads((root / "exp" / "comparison.json").read_text())
    assert "exp: 1 round a run" in compare["text"] and saved["verdict"] in compare["text"]

    # 16 ranks: the table from the summary paints first, the traces' table names the stretched rank
    overview = seen["panes"]["many_overview"]
    assert column(table_with(overview, "DataLoader wait ms"), "rank") == [str(r) for r in range(16)]
    assert f"Straggler: rank {straggler_rank(many)}" in overview["text"]
    traced = table_with(seen["panes"]["many_ranks"], "non-comm ms")
    assert len(traced["rows"]) == 16
    assert f"Straggler: rank {SLOW_RANK}." in seen["panes"]["many_ranks"]["text"]  # the rank stretched
