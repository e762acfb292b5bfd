// TensorBoard's Perf tab in a real headless Chromium: what a person sees, pane by pane.
//
//   node perf_tab_browser.mjs DIR BASE_URL OUT_DIR PLAN_JSON
//
// DIR holds the npm packages @sparticuz/chromium and puppeteer-core (npm install --prefix DIR ...); BASE_URL is a
// running tensorboard (http://127.0.0.1:PORT); screenshots go to OUT_DIR. PLAN_JSON names the runs:
// {"ddp": RUN, "many": RUN, "timed": RUN, "compare": {"baseline": RUN, "runs": [RUN, ...]}}. Opens TensorBoard at #lightning_perf, works in the tab's iframe like a
// person (picks runs, opens panes, clicks a column to sort, compares), and prints one JSON line: each pane's
// visible text and tables, the console errors, every request that was not for 127.0.0.1 (refused), timings.
import { createRequire } from "node:module";
import path from "node:path";

const [dir, base, outDir, planJson] = process.argv.slice(2);
const plan = JSON.parse(planJson);
const require = createRequire(path.join(path.resolve(dir), "node_modules", "x.js"));
const chromium = require("@sparticuz/chromium").default ?? require("@sparticuz/chromium");
const puppeteer = require("puppeteer-core");

const seen = { consoleErrors: [], external: [], panes: {}, timings: {}, screenshots: [] };
const browser = await puppeteer.launch({
  args: chromium.args,
  executablePath: await chromium.executablePath(),
  headless: true,
  defaultViewport: { width: 1400, height: 1000 },
});

async function watched() {
  const page = await browser.newPage();
  await page.setRequestInterception(true);
  page.on("request", (request) => {
    const url = new URL(request.url());
    if (["data:", "blob:", "about:"].includes(url.protocol) || url.hostname === "127.0.0.1") {
      request.continue();
    } else {
      seen.external.push(request.url());
      request.abort();
    }
  });
  page.on("console", (message) => {
    if (message.type() === "error") seen.consoleErrors.push(`${message.text()} (${message.location()?.url ?? ""})`);
  });
  page.on("pageerror", (error) => seen.consoleErrors.push(`page error: ${error.message}`));
  return page;
}

// the tab's iframe, once its page is there
async function tabFrame(page) {
  for (let i = 0; i < 600; i++) {
    const frame = page.frames().find((f) => f.url().includes("/data/plugin/lightning_perf/index.html"));
    if (frame) return frame;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error("the Perf tab's page never opened in its iframe");
}

async function ready(frame, pane, key) {
  await frame.waitForSelector(`#${pane}[data-ready=${JSON.stringify(key)}]`, { timeout: 240000 }); // 16 traces on a busy 2-core machine: tens of seconds
}

// what the pane shows: its text, and each table's header and rows as text
async function read(frame, pane) {
  return frame.$eval(`#${pane}`, (el) => ({
    text: el.innerText,
    tables: [...el.querySelectorAll("table")].map((t) => ({
      header: [...t.querySelectorAll("thead th")].map((th) => th.innerText.trim()),
      rows: [...t.querySelectorAll("tbody tr")].map((tr) => [...tr.querySelectorAll("td")].map((td) => td.innerText.trim())),
    })),
  }));
}

async function shoot(page, name) {
  const file = path.join(outDir, `${name}.png`);
  await page.screenshot({ path: file });
  seen.screenshots.push(file);
}

async function open(frame, pane, key) {
  await frame.click(`nav button[data-pane="${pane}"]`);
  await ready(frame, pane, key);
  return read(frame, pane);
}

async function pick(frame, run, pane) {
  await frame.select("#run", run);
  await ready(frame, pane, run);
  return read(frame, pane);
}

try {
  // first, while nothing is read yet: the many-rank run opened by a link to the tab's page, its first paint, then
  // its ranks read from the traces
  const direct = await watched();
  let start = Date.now();
  await direct.goto(`${base}/data/plugin/lightning_perf/index.html?run=${encodeURIComponent(plan.many)}`, { timeout: 60000 });
  const many = direct.mainFrame();
  await ready(many, "overview", plan.many);
  seen.timings.many_ranks_overview_ms = Date.now() - start;
  await many.waitForSelector("body[data-first-paint-ms]");
  seen.timings.many_ranks_first_paint_ms = Number(await many.$eval("body", (b) => b.dataset.firstPaintMs));
  seen.panes.many_overview = await read(many, "overview");
  start = Date.now();
  seen.panes.many_ranks = await open(many, "ranks", plan.many);
  seen.timings.many_ranks_traces_ms = Date.now() - start;
  await shoot(direct, "many-ranks");

  // TensorBoard itself, the Perf tab opened from its URL: the first run's Overview
  const page = await watched();
  start = Date.now();
  await page.goto(`${base}/#lightning_perf`, { waitUntil: "domcontentloaded", timeout: 60000 });
  const frame = await tabFrame(page);
  await frame.waitForSelector("#run option", { timeout: 60000 });
  const first = await frame.$eval("#run", (el) => el.value);
  await ready(frame, "overview", first);
  seen.timings.tensorboard_to_overview_ms = Date.now() - start;
  seen.timings.tab_page_first_paint_ms = Number(await frame.$eval("body", (b) => b.dataset.firstPaintMs));
  seen.runs = await frame.$$eval("#run option", (options) => options.map((o) => o.value));
  for (const run of seen.runs) {
    seen.panes[`overview ${run}`] = run === first ? await read(frame, "overview") : await pick(frame, run, "overview");
    await shoot(page, `overview-${run.replaceAll("/", "_")}`);
  }
  // a run's traces: the step breakdown and the tables, then a click on "calls" sorts the operators by it
  await pick(frame, plan.timed, "overview");
  seen.panes.traces = await open(frame, "traces", plan.timed);
  await shoot(page, "traces");
  await frame.evaluate(() => {
    const heads = [...document.querySelectorAll("#traces th")].filter((th) => th.innerText.trim() === "calls");
    heads[0].click();
  });
  seen.panes.traces_by_calls = await read(frame, "traces");
  // the DDP run's ranks, from its timing and from its traces
  await pick(frame, plan.ddp, "traces");
  seen.panes.ranks = await open(frame, "ranks", plan.ddp);
  await shoot(page, "ranks");
  // runs compared: first every run against the first; then the plan's runs against its baseline, picked by hand
  seen.panes.compare_all = await open(frame, "compare", "*");
  await frame.evaluate((wanted) => {
    document.querySelector("#compare-verdict").remove();
    for (const box of document.querySelectorAll("#compare input[type=checkbox]")) box.checked = wanted.includes(box.value);
  }, plan.compare.runs);
  await frame.select("#baseline", plan.compare.baseline);
  await frame.evaluate(() => [...document.querySelectorAll("#compare button")].find((b) => b.innerText === "Compare").click());
  await frame.waitForSelector("#compare-verdict", { timeout: 60000 });
  seen.panes.compare = await read(frame, "compare");
  seen.panes.compare.verdict = await frame.$eval("#compare-verdict", (el) => el.innerText);
  await shoot(page, "compare");

} finally {
  await browser.close();
}
console.log(JSON.stringify(seen));
