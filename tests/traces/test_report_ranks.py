"""`lightning-perf report` on a folder of 16 ranks built from a real trace, rank 9's DataLoader 40 ms late a step
while the others wait in NCCL: the cross-rank view first, rank 9 named, details of the standout ranks only."""

import json
import re

import pytest

from lightning_perf import cli
from lightning_perf.traces.report.ranks import detailed_ranks
from lightning_perf.traces.report.render import render_markdown, render_text
from tests.traces.rank_folder import build_rank_folder

TITLE = re.compile(r"^Trace \S+ \(\d+ steps, rank (\d+),", re.MULTILINE)


@pytest.fixture(scope="module")
def folder(realtraces, tmp_path_factory):
    path = tmp_path_factory.mktemp("ranks16")
    build_rank_folder(realtraces / "ddp_a100_rank1_of2" / "test.json.gz", path, world=16, slow_rank=9)
    return path


def run_cli(capsys, *args):
    code = cli.main(["report", *map(str, args), "--top", "3"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def report(folder):
    """The JSON report, read once by the real command (stdout captured by hand: capsys is per test)."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["report", str(folder), "--format", "json", "--top", "3"]) == 0
    return json.loads(out.getvalue())


@pytest.mark.timeout(300)
def test_json_keeps_every_rank_and_names_the_straggler_and_the_waiting_ranks(report):
    assert len(report["traces"]) == 16
    ranks = report["ranks"]
    assert [row["rank"] for row in ranks["rows"]] == list(range(16))
    assert ranks["straggler"] == 9 and ranks["waiting"] == [r for r in range(16) if r != 9]
    assert ranks["standout"]["slowest"] == 9
    straggler, wait = (
        next(f for f in ranks["findings"] if f["id"] == i) for i in ("straggler", "collective_wait")
    )
    assert straggler["title"] == "Straggler: rank 9, in its DataLoader wait"
    assert "median of the other 15 ranks" in straggler["evidence"]
    assert "num_workers" in straggler["recommendation"]
    assert wait["title"] == "Ranks 0-8, 10-15 wait for rank 9 in collectives"
    waited = float(re.search(r"wait ([\d.]+) ms a step in NCCL for rank 9", wait["evidence"]).group(1))
    assert waited == pytest.approx(40.0, abs=2.0)  # the 40 ms the builder put in
    # the waiting ranks' exposed communication (over 30% of their step) is not reported as their own problem
    by_rank = {t["rank"]: t for t in report["traces"]}
    assert by_rank[0]["figures"]["exposed_communication_ms_per_step"] > 0.3 * by_rank[0]["figures"]["step_ms"]
    assert all(f["id"] != "exposed_communication" for t in report["traces"] for f in t["findings"])


@pytest.mark.timeout(300)
def test_text_leads_with_the_cross_rank_view_and_details_only_the_standout_ranks(folder, report, capsys):
    code, out, _ = run_cli(capsys, folder)
    assert code == 0
    across, straggler, first_trace = (
        out.index("Across ranks:"),
        out.index("Straggler: rank 9"),
        out.index("\nTrace "),
    )
    assert across < straggler < first_trace
    assert "Details of the ranks that stand out: rank 9 (slowest)" in out
    shown = [int(r) for r in TITLE.findall(out)]
    standout = report["ranks"]["standout"]
    assert shown == sorted(standout.values()) and 9 in shown and len(shown) == 3  # sorted by rank


@pytest.mark.timeout(300)
def test_rank_and_all_ranks_choose_the_details(report):
    # the command passes detailed_ranks(...) to the renderer: the same call here, on the report read once
    chosen = render_text(report, detailed_ranks(report, [2, 14]))
    shown = [int(r) for r in TITLE.findall(chosen)]
    assert shown == sorted(set(report["ranks"]["standout"].values()) | {2, 14})
    every = render_text(report, detailed_ranks(report, every=True))
    assert [int(r) for r in TITLE.findall(every)] == list(range(16))
    assert every.index("Trace ") < every.index("Across ranks:")  # all details, then the cross-rank view
    markdown = render_markdown(report, detailed_ranks(report))
    assert (
        markdown.index("## Across ranks") < markdown.index("Straggler: rank 9") < markdown.index("## Trace ")
    )
    assert markdown.count("## Trace ") == 3


@pytest.mark.timeout(300)
def test_a_rank_without_a_trace_is_an_error_naming_the_ranks_there(realtraces, capsys):
    one = realtraces / "ddp_a100_rank1_of2" / "test.json.gz"
    code, out, err = run_cli(capsys, one, "--rank", "5")
    assert code == 2 and out == ""
    assert "--rank 5: no trace of that rank" in err and "(ranks with traces: 1)" in err
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["report", str(one), "--rank", "-1"])
    assert exit_info.value.code == 2
    assert "--rank must be a global rank (an integer >= 0), got -1" in capsys.readouterr().err
