// TensorBoard's Text tab in a real headless Chromium: what a person sees of lightning-perf's texts.
//
// Used by benchmarks/render_text_tab.py --browser DIR, where DIR holds the two npm packages this needs:
//   npm install --prefix DIR @sparticuz/chromium puppeteer-core
// (@sparticuz/chromium ships a headless Chromium inside its npm package, so the npm registry is all it needs.)
//
//   node benchmarks/text_tab_browser.mjs DIR URL SCREENSHOT.png
//
// Opens URL (TensorBoard's #text), waits until the texts have rendered, takes a full-page screenshot and prints
// one JSON line: for each rendered text (its run and tag as the page shows them), its tables' innermost cells as
// seen (their text), its code spans, its list items and paragraphs, and whether a "->" or a bare "&gt;" shows.
import { createRequire } from "node:module";
import path from "node:path";

const [dir, url, screenshot] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(dir), "node_modules", "x.js"));
const chromium = require("@sparticuz/chromium").default ?? require("@sparticuz/chromium");
const puppeteer = require("puppeteer-core");

const browser = await puppeteer.launch({
  args: chromium.args,
  executablePath: await chromium.executablePath(),
  headless: true,
  defaultViewport: { width: 1400, height: 1000 },
});
try {
  const page = await browser.newPage();
  await page.goto(url, { waitUntil: "networkidle0", timeout: 60000 });
  // every element of the page, shadow roots included (TensorBoard's dashboards are web components)
  const collect = () => {
    const all = [];
    const walk = (root) => {
      for (const el of root.querySelectorAll("*")) {
        all.push(el);
        if (el.shadowRoot) walk(el.shadowRoot);
      }
    };
    walk(document);
    const texts = all.filter((el) => el.tagName === "TABLE" || el.tagName === "CODE" || el.tagName === "LI");
    const cells = all
      .filter((el) => (el.tagName === "TD" || el.tagName === "TH") && !el.querySelector("table"))
      .map((el) => el.innerText);
    const visible = all
      .filter((el) => el.tagName === "P" || el.tagName === "LI" || el.tagName === "TD")
      .map((el) => el.innerText);
    return {
      tables: all.filter((el) => el.tagName === "TABLE").length,
      code: all.filter((el) => el.tagName === "CODE").map((el) => el.innerText),
      items: all.filter((el) => el.tagName === "LI").length,
      paragraphs: all.filter((el) => el.tagName === "P").length,
      cells,
      arrows: visible.filter((t) => t.includes("→")).length,
      ascii_arrows: visible.filter((t) => t.includes("->")).length,
      rendered: texts.length,
    };
  };
  let seen = await page.evaluate(collect);
  for (let i = 0; i < 60 && seen.tables === 0; i++) {
    await new Promise((resolve) => setTimeout(resolve, 1000));
    seen = await page.evaluate(collect);
  }
  await page.screenshot({ path: screenshot, fullPage: true });
  console.log(JSON.stringify(seen));
} finally {
  await browser.close();
}
