"""What TensorBoard's Text tab serves for lightning-perf's texts: a tiny fit per num_workers, `compare`, a real
`tensorboard`, and the text plugin's JSON (``/data/plugin/text/text?run=...&tag=...``), whose HTML is TensorBoard's
own server-side rendering of our Markdown. Prints each text's HTML and checks it renders as written: paragraphs,
lists, tables of short cells (<= 40 characters a line), code spans, arrows intact. With ``--browser DIR`` it also
opens the Text tab in a real headless Chromium (``benchmarks/text_tab_browser.mjs``, node with the npm packages
``@sparticuz/chromium`` and ``puppeteer-core`` installed under DIR), checks what the page shows (tables, cells of
<= 40 characters, code spans, lists, arrows as →, no "->") and saves a screenshot; without it the script says
so and checks the served HTML only.

    npm install --prefix /tmp/browser @sparticuz/chromium puppeteer-core     # once; the npm registry only
    .venv/bin/python benchmarks/render_text_tab.py [--keep DIR] [--browser /tmp/browser] [--screenshot FILE]

Exit code 0 when every text renders as written, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lightning.pytorch.loggers import TensorBoardLogger  # noqa: E402

from lightning_perf import PerfCallback  # noqa: E402
from lightning_perf.cli import main as cli_main  # noqa: E402
from tests.helpers import TinyModel, loader, trainer  # noqa: E402
from tests.tensorboard_server import TensorBoardServer  # noqa: E402

MAX_CELL = 40


def problems(html: str) -> list[str]:
    found = []
    if "-&gt;" in html:
        found.append("an arrow '->' left as text")
    if re.search(r"<p>[^<]*&gt; ", html):
        found.append("a stray '>' in a paragraph")
    # innermost cells only: the plugin wraps a text in a one-cell table of its own
    for cell in re.findall(r"<t[dh]>((?:(?!<t[dh]>|<table>).)*?)</t[dh]>", html, re.S):
        for line in cell.split("<br>"):
            text = re.sub(r"<[^>]+>", "", line)
            if len(text) > MAX_CELL:
                found.append(f"table cell line of {len(text)} chars: {text[:60]}...")
    if "<table>" not in html:
        found.append("no table")
    return found


def in_browser(browser_dir: str, url: str, screenshot: str) -> list[str]:
    """The Text tab as headless Chromium renders it (text_tab_browser.mjs); the problems a person would see."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "text_tab_browser.mjs")
    done = subprocess.run(
        ["node", script, browser_dir, url, screenshot], capture_output=True, text=True, timeout=180
    )
    if done.returncode != 0:
        return [f"the browser failed: {done.stderr.strip()[-400:]}"]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"in headless Chromium: {json.dumps({k: v for k, v in seen.items() if k != 'cells'})}")
    found = []
    if seen["tables"] < 3:  # the two diagnoses' tables and the comparison's
        found.append(f"{seen['tables']} tables shown")
    long = [cell for cell in seen["cells"] if any(len(line) > MAX_CELL for line in cell.splitlines())]
    found += [f"a table cell line over {MAX_CELL} characters: {cell[:60]!r}" for cell in long]
    if not seen["code"]:
        found.append("no code span shown")
    if not seen["items"]:
        found.append("no list shown")
    if seen["ascii_arrows"]:
        found.append(f"{seen['ascii_arrows']} texts show '->'")
    if not seen["arrows"]:
        found.append("no arrow → shown")
    print(f"screenshot: {screenshot}")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", metavar="DIR", help="write the runs here and keep them")
    parser.add_argument(
        "--browser", metavar="DIR", help="check the Text tab in headless Chromium (npm packages under DIR)"
    )
    parser.add_argument("--screenshot", default="text_tab.png", metavar="FILE", help="with --browser")
    args = parser.parse_args()
    root = args.keep or tempfile.mkdtemp(prefix="render_text_tab_")
    for workers in (0, 2):
        logger = TensorBoardLogger(root, name="exp", version=f"workers{workers}")
        callback = PerfCallback(enable_profiler=False, probe_num_workers="never")
        trainer(root, [callback], logger=logger, limit_train_batches=64, log_every_n_steps=50).fit(
            TinyModel(), loader(n=256, delay_s=0.002, num_workers=workers)
        )
    cli_main(["compare", os.path.join(root, "exp"), "--format", "json"])
    server = TensorBoardServer(root)
    failed = 0
    try:
        tags = server.wait_for(
            "/data/plugin/text/tags", lambda r: "exp/perf_compare" in r and "exp/workers2" in r
        )
        for run, run_tags in sorted(tags.items()):
            for tag in run_tags:
                entries = server.get("/data/plugin/text/text", run=run, tag=tag)
                html = entries[-1]["text"]
                print(f"===== run={run} tag={tag} ({len(entries)} text(s))\n{html}\n")
                found = problems(html) if "diagnosis" in tag or "comparison" in tag else []
                if "diagnosis" in tag or "comparison" in tag:
                    found += [f"{len(entries)} texts, expected one"] if len(entries) != 1 else []
                print("----- " + ("; ".join(found) if found else "renders as written") + "\n")
                failed += bool(found)
        if args.browser:
            seen = in_browser(args.browser, f"http://127.0.0.1:{server.port}/#text", args.screenshot)
            print("----- in the browser: " + ("; ".join(seen) if seen else "renders as written"))
            failed += bool(seen)
        else:
            print("no --browser: checked the served HTML only")
    finally:
        server.close()
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
