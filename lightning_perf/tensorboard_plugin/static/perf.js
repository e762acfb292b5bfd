// The Perf tab's page: plain DOM, no library. Every pane asks its own route when it is opened (the Overview
// reads the run's summary only; a trace is read when its pane opens) and keeps the answer until the run changes.
// Text from the files goes in as text (textContent), never as HTML.

const state = { runs: [], run: null, pane: "overview", loaded: {} };

// -- small helpers ---------------------------------------------------------------------------------------
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

// replaceChildren that skips absent parts and flattens lists, as h() does
function put(el, ...children) {
  el.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
}

const SVG = "http://www.w3.org/2000/svg";
function s(tag, attrs = {}) {
  const el = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) el.setAttribute(key, value);
  return el;
}

function fmt(value, digits = 1) {
  if (value === null || value === undefined || Number.isNaN(value)) return "-";
  if (typeof value !== "number") return String(value);
  return value.toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });
}

function bytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${fmt(n, i ? 1 : 0)} ${units[i]}`;
}

async function getJSON(route, params) {
  const query = new URLSearchParams(params || []).toString();
  const response = await fetch(route + (query ? "?" + query : ""));
  const data = await response.json();
  if (!response.ok) throw new Error(data.error || `${route}: HTTP ${response.status}`);
  return data;
}

// A table whose columns sort on a click (numbers high first, names A-Z first; sortKey/desc: the first order). columns: {key, label, num,
// digits, cls, render(row)}; rowClass(row) marks a row.
function table(columns, rows, { sortable = true, rowClass = null, sortKey = null, desc = true } = {}) {
  const tbody = h("tbody");
  const order = { key: sortKey, desc };
  const heads = columns.map((c) =>
    h("th", { class: [c.num ? "num" : "", sortable ? "sortable" : ""].join(" ").trim(), "data-key": c.key }, c.label),
  );
  const fill = () => {
    let shown = rows.slice();
    if (order.key !== null) {
      shown.sort((a, b) => {
        const x = a[order.key], y = b[order.key];
        if (x === y) return 0;
        if (x === null || x === undefined) return 1;
        if (y === null || y === undefined) return -1;
        const less = typeof x === "number" ? x < y : String(x).localeCompare(String(y)) < 0;
        return (less ? -1 : 1) * (order.desc ? -1 : 1);
      });
    }
    tbody.replaceChildren(
      ...shown.map((row) =>
        h(
          "tr",
          { class: rowClass ? rowClass(row) : null },
          columns.map((c) =>
            h("td", { class: [c.num ? "num" : "", c.cls || ""].join(" ").trim() || null },
              c.render ? c.render(row) : c.num ? fmt(row[c.key], c.digits ?? 1) : (row[c.key] ?? "-")),
          ),
        ),
      ),
    );
    heads.forEach((th) => {
      th.classList.remove("sorted-asc", "sorted-desc");
      if (th.dataset.key === order.key) th.classList.add(order.desc ? "sorted-desc" : "sorted-asc");
    });
  };
  if (sortable) {
    heads.forEach((th, i) =>
      th.addEventListener("click", () => {
        const key = columns[i].key;
        order.desc = order.key === key ? !order.desc : Boolean(columns[i].num);
        order.key = key;
        fill();
      }),
    );
  }
  fill();
  return h("table", {}, h("thead", {}, h("tr", {}, heads)), tbody);
}

// the findings' own Markdown code spans (`num_workers=4`) shown as code, the rest as text
function prose(text) {
  return String(text ?? "").split("`").map((part, i) => (i % 2 ? h("code", {}, part) : part));
}

function figure(label, value) {
  return h("div", { class: "figure" }, h("div", { class: "value" }, value), h("div", { class: "label" }, label));
}

function showError(pane, err) {
  put(pane, h("p", { class: "error" }, String(err.message || err)));
}

// -- Overview ------------------------------------------------------------------------------------------
function stepChart(series, slowdowns) {
  const steps = series.step_ms || [];
  const waits = series.wait_ms || [];
  if (!steps.length) return h("p", { class: "muted" }, "No per-step series in this summary.");
  const width = 900, height = 220, pad = 36;
  const top = Math.max(...steps) * 1.05 || 1;
  const x = (i) => pad + ((width - pad - 8) * i) / Math.max(1, steps.length - 1);
  const y = (v) => height - 20 - ((height - 30) * v) / top;
  const svg = s("svg", { class: "chart", width, height, viewBox: `0 0 ${width} ${height}`, role: "img" });
  const area = (low, high, color, label) => {
    const upper = steps.map((_, i) => `${x(i)},${y(high(i))}`);
    const lower = steps.map((_, i) => `${x(i)},${y(low(i))}`).reverse();
    const path = s("polygon", { points: upper.concat(lower).join(" "), fill: color, "fill-opacity": "0.8" });
    path.append(s("title"));
    path.firstChild.textContent = label;
    svg.append(path);
  };
  const wait = (i) => Math.min(waits[i] ?? 0, steps[i]);
  area(() => 0, (i) => steps[i] - wait(i), "#1976d2", "compute");
  area((i) => steps[i] - wait(i), (i) => steps[i], "#f57c00", "DataLoader wait");
  for (const v of [0, top / 2, top]) {
    const label = s("text", { x: 2, y: y(v) + 4, "font-size": 10, fill: "#757575" });
    label.textContent = `${fmt(v)} ms`;
    svg.append(label, s("line", { x1: pad, x2: width - 8, y1: y(v), y2: y(v), stroke: "#eeeeee" }));
  }
  for (const slow of slowdowns || []) {
    const at = x(slow.step / (series.every || 1));
    svg.append(s("line", { x1: at, x2: at, y1: 4, y2: height - 20, stroke: "#c62828", "stroke-dasharray": "4 3" }));
  }
  const axis = s("text", { x: width / 2, y: height - 4, "font-size": 10, fill: "#757575", "text-anchor": "middle" });
  axis.textContent = `training step (${steps.length} kept${series.every > 1 ? `, one every ${series.every}` : ""})`;
  svg.append(axis);
  return h("div", {},
    svg,
    h("div", { class: "legend" },
      h("span", {}, h("span", { class: "swatch sw-compute" }), "compute"),
      h("span", {}, h("span", { class: "swatch sw-wait" }), "DataLoader wait"),
      (slowdowns || []).length ? h("span", {}, h("span", { class: "swatch sw-mark" }), "change-point (lasting slowdown)") : null,
    ),
  );
}

// lines over the steps: [{values, color, label}] beside xs (a value null where it was not read)
function lineChart(xs, lines, unit) {
  const width = 900, height = 180, pad = 44;
  const all = lines.flatMap((l) => l.values).filter((v) => v !== null && v !== undefined);
  if (!xs.length || !all.length) return null;
  const low = Math.min(...all) * 0.98, high = Math.max(...all) * 1.02 || 1;
  const x = (step) => pad + ((width - pad - 8) * (step - xs[0])) / Math.max(1, xs[xs.length - 1] - xs[0]);
  const y = (v) => height - 20 - ((height - 30) * (v - low)) / Math.max(high - low, 1e-9);
  const svg = s("svg", { class: "chart", width, height, viewBox: `0 0 ${width} ${height}`, role: "img" });
  for (const v of [low, (low + high) / 2, high]) {
    const label = s("text", { x: 2, y: y(v) + 4, "font-size": 10, fill: "#757575" });
    label.textContent = `${fmt(v, 0)} ${unit}`;
    svg.append(label, s("line", { x1: pad, x2: width - 8, y1: y(v), y2: y(v), stroke: "#eeeeee" }));
  }
  for (const line of lines) {
    const points = xs.map((step, i) => [step, line.values[i]]).filter(([, v]) => v !== null && v !== undefined);
    svg.append(s("polyline", { points: points.map(([step, v]) => `${x(step)},${y(v)}`).join(" "), fill: "none", stroke: line.color, "stroke-width": 2 }));
  }
  const axis = s("text", { x: width / 2, y: height - 4, "font-size": 10, fill: "#757575", "text-anchor": "middle" });
  axis.textContent = `training step ${xs[0]}-${xs[xs.length - 1]}`;
  svg.append(axis);
  return h("div", {}, svg, h("div", { class: "legend" },
    lines.filter((l) => l.values.length).map((l) => h("span", {}, h("span", { class: "swatch", "data-color": l.color }), l.label))));
}

function colourSwatches(root) {
  root.querySelectorAll(".swatch[data-color]").forEach((el) => { el.style.background = el.dataset.color; });
}

// where the mean step goes: each part of the step as a share of it, then the user's callbacks and loggers
function anatomyView(anatomy) {
  if (!anatomy) return null;
  const bar = h("div", { class: "bar" });
  const legend = h("div", { class: "legend anatomy-legend" });
  anatomy.parts.filter((p) => p.pct > 0).forEach((p, i) => {
    const colour = PALETTE[i % PALETTE.length];
    const part = h("span", { title: `${p.label} ${fmt(p.pct)}%` });
    part.style.width = `${p.pct}%`;
    part.style.background = colour;
    bar.append(part);
    legend.append(h("span", {}, h("span", { class: "swatch", "data-color": colour }), `${p.label} ${fmt(p.pct)}%`));
  });
  // the hooks' steps, named apart from the step clock's "steps timed": past a fit's start one step in
  // sample_every has its hooks timed
  const every = anatomy.sample_every || 1;
  const timed = `hooks timed on ${anatomy.steps} steps${every > 1 ? `, one in ${every}` : ""}`;
  const rows = anatomy.parts.map((p) => ({ what: p.label, ms: p.ms, pct: p.pct }))
    .concat(anatomy.code.map((c) => ({ what: c.name, ms: c.ms, pct: (100 * c.ms) / anatomy.step_ms, code: true })));
  return [
    h("h3", {}, `Where the mean step goes (${fmt(anatomy.step_ms, 3)} ms; ${timed})`),
    bar,
    legend,
    table(
      [
        { key: "what", label: "part", render: (r) => (r.code ? h("code", {}, r.what) : r.what) },
        { key: "ms", label: "ms a step", num: true, digits: 3 },
        { key: "pct", label: "share %", num: true },
      ],
      rows,
      { sortable: false },
    ),
  ];
}

const PALETTE = ["#f57c00", "#7b1fa2", "#1976d2", "#00897b", "#c62828", "#fbc02d", "#5d4037", "#43a047", "#3949ab", "#8e24aa", "#6d4c41", "#9e9e9e"];

function memoryChart(memory) {
  if (!memory || !memory.steps.length) return null;
  const lines = [{ values: memory.process_rss_mb, color: "#7b1fa2", label: "process RSS (MB)" }];
  if (memory.gpu_allocated_mb.length) lines.push({ values: memory.gpu_allocated_mb, color: "#00897b", label: "GPU allocated (MB)" });
  const chart = lineChart(memory.steps, lines, "MB");
  return chart ? [h("h3", {}, "Memory over the steps"), chart] : null;
}

function findingsTable(findings) {
  if (!findings.length) return h("p", { class: "muted" }, "No findings.");
  return table(
    [
      { key: "severity", label: "severity", render: (f) => h("span", { class: `sev-${f.severity}` }, f.severity) },
      { key: "title", label: "finding" },
      { key: "evidence", label: "evidence", render: (f) => h("span", {}, prose(f.evidence)) },
      { key: "recommendation", label: "what to do", render: (f) => h("span", {}, prose(f.recommendation)) },
      { key: "change", label: "settings change", render: (f) => (f.change ? h("code", {}, f.change) : "-") },
    ],
    findings,
    { sortable: false },
  );
}

function ranksTable(ranks, straggler) {
  return table(
    [
      { key: "rank", label: "rank", num: true, digits: 0 },
      { key: "host", label: "host" },
      { key: "step_time_ms", label: "step ms", num: true },
      { key: "data_wait_ms", label: "DataLoader wait ms", num: true },
      { key: "gpu_util_pct", label: "GPU %", num: true },
      { key: "cpu_util_pct", label: "CPU %", num: true },
      { key: "role", label: "", render: (r) => (straggler && r.rank === straggler.rank ? "straggler" : "") },
    ],
    ranks,
    { rowClass: (r) => (straggler && r.rank === straggler.rank ? "standout" : null), sortKey: "rank", desc: false },
  );
}

function probeTable(probe) {
  const rows = (probe.candidates || []).map((c) => ({ ...c, error: c.error || "" }));
  return h("div", {},
    table(
      [
        { key: "num_workers", label: "num_workers", num: true, digits: 0 },
        { key: "batches_per_sec", label: "batches/s", num: true },
        { key: "startup_ms", label: "start-up ms", num: true },
        { key: "status", label: "status" },
        { key: "error", label: "error" },
      ],
      rows,
      { rowClass: (c) => (c.num_workers === probe.suggested ? "standout" : null) },
    ),
    probe.compute_batches_per_sec != null ? h("p", {}, `The model computes ${fmt(probe.compute_batches_per_sec)} batches/s.`) : null,
    probe.suggested != null ? h("p", {}, "Suggested: ", h("code", {}, `num_workers=${probe.suggested}`), ` ${probe.reason || ""}`) : h("p", { class: "muted" }, probe.reason || ""),
  );
}

function utilization(data) {
  const rows = [];
  const add = (what, value, unit) => rows.push({ what, value: value == null ? "-" : `${fmt(value)} ${unit}` });
  const cpu = data.utilization.cpu || {};
  add("training process CPU", cpu.process_cpu_pct, "% of a core");
  add("DataLoader workers CPU", cpu.workers_cpu_pct, "% of a core");
  add("whole machine CPU", cpu.system_cpu_pct, "% of a core");
  add("process memory", cpu.process_rss_gb, "GB");
  const gpu = data.utilization.gpu;
  if (gpu) {
    add("GPU utilization", gpu.util_pct, "%");
    add("GPU kernel-busy (traces)", gpu.kernel_busy_pct, "%");
    add("GPU memory peak", gpu.peak_mem_used_gb, "GB");
    add("GPU power", gpu.power_w, "W");
  } else {
    rows.push({ what: "GPU", value: data.utilization.gpu_unavailable_reason || "not measured" });
  }
  if (data.machine) add("other processes on the machine", data.machine.other_cores, "cores");
  return table([{ key: "what", label: "" }, { key: "value", label: "" }], rows, { sortable: false });
}

function fileLink(run, file, route = "file", label = file) {
  const href = `${route}?${new URLSearchParams({ run, file })}`;
  return h("a", { href, download: "" }, label);
}

// a trace's downloads: the file itself (for Perfetto or chrome://tracing) and its Speedscope export
function traceLinks(run, file) {
  return h("span", { class: "links" }, "download: ", fileLink(run, file, "file", "trace"), " | ",
    fileLink(run, file, "speedscope", "Speedscope export"));
}

async function showOverview(pane) {
  const d = await getJSON("overview", { run: state.run });
  const t = d.timing;
  const verdict = d.verdict
    ? h("div", { class: `verdict${d.verdict.verdict === "not input-bound" ? " not" : ""}` },
        "Verdict: ", h("b", {}, d.verdict.verdict), h("div", { class: "muted" }, d.verdict.evidence))
    : h("div", { class: "verdict" }, "Verdict: unknown (no DataLoader timing was measured)");
  put(pane, 
    h("h2", {}, `${d.name}`, h("span", { class: "muted" }, ` (${d.stage}, ${d.status}, world size ${d.world_size})`)),
    verdict,
    h("div", { class: "figures" },
      figure("mean step", `${fmt(t.step_time_ms?.mean)} ms`),
      figure("median step", `${fmt(t.step_time_ms?.median)} ms`),
      figure("DataLoader wait", `${fmt(t.data_wait_pct)} %`),
      figure("samples/s", fmt(t.samples_per_sec)),
      figure("steps timed", fmt(t.steps, 0)),
      d.compute_limit?.mfu_pct != null ? figure("MFU (of the measured peak)", `${Number(d.compute_limit.mfu_pct.toPrecision(2))} %`) : null,
    ),
    h("h3", {}, "Findings"),
    findingsTable(d.findings),
    h("h3", {}, "Step time over the steps"),
    stepChart(d.series, d.slowdowns),
    d.slowdowns.length
      ? table(
          [
            { key: "step", label: "from step", num: true, digits: 0 },
            { key: "before_ms", label: "before ms", num: true },
            { key: "after_ms", label: "after ms", num: true },
            { key: "ratio", label: "ratio", num: true, digits: 2 },
          ],
          d.slowdowns,
          { sortable: false },
        )
      : null,
    anatomyView(d.anatomy),
    memoryChart(d.memory),
    h("h3", {}, "Utilization"),
    utilization(d),
    d.ranks ? [h("h3", {}, "Ranks"), ranksTable(d.ranks.rows, d.ranks.straggler),
      d.ranks.straggler ? h("p", {}, `Straggler: rank ${d.ranks.straggler.rank}, busy ${fmt(d.ranks.straggler.busy_ms)} ms a step against ${fmt(d.ranks.straggler.median_busy_ms)} ms for the median rank.`) : h("p", { class: "muted" }, "No straggler: the ranks keep pace.")] : null,
    d.num_workers_probe ? [h("h3", {}, "num_workers probe"), probeTable(d.num_workers_probe)] : null,
    h("h3", {}, "Files"),
    h("p", {}, "Run folder: ", h("code", {}, d.run_dir)),
    table(
      [
        { key: "file", label: "file", cls: "name", render: (f) => fileLink(d.name, f.file) },
        { key: "kind", label: "kind" },
        { key: "bytes", label: "size", num: true, render: (f) => bytes(f.bytes) },
      ],
      d.files,
      { sortable: false },
    ),
  );
  colourSwatches(pane);
  state.overview = d;
}

// -- Traces ----------------------------------------------------------------------------------------------
const CATEGORIES = ["dataloader", "cpu_exec", "kernel", "memcpy", "memset", "communication", "runtime", "other"];

function breakdown(trace) {
  const avg = trace.average;
  if (!avg) return h("p", { class: "muted" }, "No ProfilerStep in this trace: no step breakdown.");
  const bar = h("div", { class: "bar" });
  for (const c of CATEGORIES) {
    const pct = avg.categories_pct[c] || 0;
    if (pct > 0) {
      const part = h("span", { class: `cat-${c}`, title: `${c} ${fmt(pct)}%` });
      part.style.width = `${pct}%`;
      bar.append(part);
    }
  }
  const rows = trace.steps.map((st) => ({ step: st.step, duration_ms: st.duration_ms, ...st.categories_ms }));
  rows.push({ step: "average", duration_ms: avg.duration_ms, ...avg.categories_ms });
  return h("div", {},
    h("p", {}, `${avg.steps} steps, ${fmt(avg.duration_ms, 3)} ms a step on average: `,
      CATEGORIES.filter((c) => avg.categories_pct[c]).map((c) => `${c} ${fmt(avg.categories_pct[c])}%`).join(", ")),
    bar,
    table(
      [{ key: "step", label: "step" }, { key: "duration_ms", label: "step ms", num: true, digits: 3 },
        ...CATEGORIES.map((c) => ({ key: c, label: c, num: true, digits: 3 }))],
      rows,
      { sortable: false },
    ),
  );
}

function operatorTable(rows) {
  if (!rows.length) return h("p", { class: "muted" }, "None recorded.");
  return table(
    [
      { key: "name", label: "name", cls: "name" },
      { key: "calls", label: "calls", num: true, digits: 0 },
      { key: "self_ms", label: "self ms", num: true, digits: 3 },
      { key: "total_ms", label: "total ms", num: true, digits: 3 },
    ],
    rows,
    { sortKey: "self_ms" },
  );
}

async function showTrace(out, file) {
  put(out, h("p", { class: "muted" }, `Reading ${file} ...`));
  try {
    const t = await getJSON("trace", { run: state.run, file });
    put(out, 
      h("h3", {}, `Step breakdown (${t.alignment} alignment)`),
      breakdown(t),
      h("h3", {}, "Findings of this trace"),
      findingsTable(t.findings.map((f) => ({ ...f, change: Object.entries(f.settings_change).map(([k, v]) => `${k}=${v}`).join(", ") }))),
      h("h3", {}, `Operators (CPU), top ${t.top_cpu_operators.length} by self time`),
      operatorTable(t.top_cpu_operators),
      h("h3", {}, `GPU kernels, top ${t.top_kernels.length} by time`),
      operatorTable(t.top_kernels),
      h("p", { class: "muted" }, `${t.events.toLocaleString("en-US")} events; kernel-busy ${fmt(t.kernel_busy_pct)}%; rank ${t.rank ?? "-"}.`),
    );
  } catch (err) {
    showError(out, err);
  }
}

async function showTraces(pane) {
  const d = state.overview || (await getJSON("overview", { run: state.run }));
  if (!d.traces.length) {
    put(pane, h("p", { class: "muted" }, "This run recorded no trace (enable_profiler=False, or no profiled cycle)."));
    return;
  }
  const out = h("div");
  const select = h("select", { id: "trace", onchange: () => showTrace(out, select.value) },
    d.traces.map((t) => h("option", { value: t.file }, `${t.file} (${bytes(t.bytes)}${t.steps.length ? `, steps ${t.steps.join(", ")}` : ""})`)));
  put(pane, h("div", { class: "picker" }, h("label", {}, "trace ", select), traceLinks(d.name, d.traces[0].file)), out);
  select.addEventListener("change", () => pane.querySelector(".picker .links").replaceWith(traceLinks(d.name, select.value)));
  await showTrace(out, select.value);
}

// -- Ranks -----------------------------------------------------------------------------------------------
async function showRanks(pane) {
  const d = state.overview || (await getJSON("overview", { run: state.run }));
  const parts = [];
  if (d.ranks) parts.push(h("h3", {}, "Per rank, from the run's timing"), ranksTable(d.ranks.rows, d.ranks.straggler));
  if (d.traces.length) {
    put(pane, ...parts, h("p", { class: "muted" }, `Reading ${d.traces.length} trace(s) ...`));
    const r = await getJSON("trace_ranks", { run: state.run });
    parts.push(h("h3", {}, "Per rank, from the traces"));
    if (r.ranks) {
      const roles = Object.fromEntries(Object.entries(r.ranks.standout || {}).map(([role, rank]) => [rank, role]));
      parts.push(
        table(
          [
            { key: "rank", label: "rank", num: true, digits: 0 },
            { key: "step_ms", label: "step ms", num: true, digits: 3 },
            { key: "busy_ms", label: "non-comm ms", num: true, digits: 3 },
            { key: "exposed_communication_ms_per_step", label: "exposed comm ms", num: true, digits: 3 },
            { key: "wait_ms", label: "wait ms", num: true, digits: 3 },
            { key: "kernel_busy_pct", label: "kernel-busy %", num: true },
            { key: "step_idle_pct", label: "GPU idle %", num: true },
            { key: "dataloader_call_ms", label: "DataLoader ms", num: true, digits: 3 },
            { key: "role", label: "", render: (row) => (row.rank === r.ranks.straggler ? "straggler" : (roles[row.rank] || "").replace("_", " ")) },
          ],
          r.ranks.rows,
          { rowClass: (row) => (row.rank === r.ranks.straggler ? "standout" : null), sortKey: "rank", desc: false },
        ),
        h("p", {}, r.ranks.straggler != null ? `Straggler: rank ${r.ranks.straggler}.` : "No straggler among the traced ranks."),
        findingsTable(r.ranks.findings.map((f) => ({ ...f, change: "" }))),
      );
    } else {
      parts.push(h("p", { class: "muted" }, "The traces come from one rank: no cross-rank table."));
    }
    parts.push(
      table(
        [
          { key: "file", label: "trace", cls: "name" },
          { key: "rank", label: "rank", num: true, digits: 0 },
          { key: "steps", label: "steps", num: true, digits: 0 },
          { key: "step_ms", label: "step ms", num: true, digits: 3 },
          { key: "findings", label: "findings", num: true, digits: 0 },
        ],
        r.traces,
      ),
      ...r.notes.map((n) => h("p", { class: "muted" }, n)),
      ...r.unreadable.map((u) => h("p", { class: "error" }, u.error)),
    );
  } else if (!d.ranks) {
    parts.push(h("p", { class: "muted" }, "One rank and no trace: nothing to show per rank."));
  }
  put(pane, ...parts);
}

// -- Compare ---------------------------------------------------------------------------------------------
// a comparison as compare's JSON has it: the verdict, each metric's cells as its text table prints them, what differs
function comparisonView(c, verdictId) {
  const header = c.run_names.map((n) => (n === c.baseline ? `${n} (baseline)` : n));
  const columns = [{ key: "key", label: "" }, ...header.map((label, i) => ({ key: String(i), label }))];
  const diffTable = (diff) =>
    table(columns, Object.entries(diff).map(([key, values]) => ({ key, ...Object.fromEntries(values.map((v, i) => [i, v === null ? "-" : String(v)])) })), { sortable: false });
  const metrics = c.metrics.map((m) => ({ key: `${m.label} (${m.unit})`, ...Object.fromEntries((c.cells[m.key] || []).map((v, i) => [i, v])) }));
  return [
    h("p", { class: "verdict", id: verdictId }, c.verdict),
    c.warnings.map((w) => h("p", { class: "muted" }, w)),
    table(columns, metrics, { sortable: false }),
    Object.keys(c.settings_diff).length ? [h("h3", {}, "Settings that differ"), diffTable(c.settings_diff)] : h("p", { class: "muted" }, "No settings differ between the runs."),
    Object.keys(c.hparams_diff).length ? [h("h3", {}, "Hyperparameters that differ"), diffTable(c.hparams_diff)] : null,
    Object.keys(c.environment_diff).length ? [h("h3", {}, "Environment that differs"), diffTable(c.environment_diff)] : null,
    c.method ? h("p", { class: "muted" }, `method: ${c.method}`) : null,
  ];
}

async function runComparison(out, picked, baseline) {
  put(out, h("p", { class: "muted" }, "Comparing ..."));
  try {
    const params = new URLSearchParams({ baseline });
    picked.forEach((name) => params.append("run", name));
    put(out, comparisonView(await getJSON("compare", params), "compare-verdict"));
  } catch (err) {
    showError(out, err);
  }
}

// the trials under the log dir (lightning-perf trial's comparison.json): their rounds, as the trial decided
async function showTrials(out) {
  const { trials } = await getJSON("trials");
  put(out, trials.length ? h("h2", {}, "Trials") : null, trials.map((t) => [
    h("h3", { class: "trial" }, t.error ? t.name : `${t.name}: ${t.rounds} round${t.rounds === 1 ? "" : "s"} a run`),
    t.error ? h("p", { class: "error" }, t.error) : comparisonView(t, null),
  ]));
}

async function showCompare(pane) {
  const usable = state.runs.filter((r) => !r.error);
  const trials = h("div", { id: "trials" });
  if (usable.length < 2) {
    put(pane, h("p", { class: "muted" }, "Comparing needs two runs or more under the log dir."), trials);
    return showTrials(trials);
  }
  const boxes = usable.map((r) => h("input", { type: "checkbox", value: r.name, checked: true }));
  const baseline = h("select", { id: "baseline" }, usable.map((r) => h("option", { value: r.name }, r.name)));
  const out = h("div");
  const go = () => runComparison(out, boxes.filter((b) => b.checked).map((b) => b.value), baseline.value);
  put(pane,
    h("div", { class: "picker" },
      h("label", {}, "baseline ", baseline),
      boxes.map((b, i) => h("label", {}, b, ` ${runTitle(usable[i])}`)),
      h("button", { onclick: go }, "Compare"),
    ),
    out,
    trials,
  );
  await Promise.all([go(), showTrials(trials)]);
}

// -- panes and runs ---------------------------------------------------------------------------------------
// a run by its name and what tells it apart from the others (version_1: prefetch_factor=4, lr=0.02)
const runTitle = (r) => (r.label ? `${r.name}: ${r.label}` : r.name);
const PANES = { overview: showOverview, traces: showTraces, ranks: showRanks, compare: showCompare };

async function openPane(name) {
  state.pane = name;
  document.querySelectorAll("nav button").forEach((b) => b.classList.toggle("active", b.dataset.pane === name));
  document.querySelectorAll(".pane").forEach((p) => { p.hidden = p.id !== name; });
  const pane = document.getElementById(name);
  const key = name === "compare" ? "*" : state.run; // the comparison is of runs picked in its pane
  if (state.loaded[name] === key) return;
  state.loaded[name] = key;
  put(pane, h("p", { class: "muted" }, "Loading ..."));
  delete pane.dataset.ready;
  try {
    await PANES[name](pane);
  } catch (err) {
    showError(pane, err);
  }
  if (state.loaded[name] === key) pane.dataset.ready = key; // what a test waits for: this pane, this run
}

async function main() {
  const select = document.getElementById("run");
  try {
    const data = await getJSON("runs");
    state.runs = data.runs;
    if (!state.runs.length) {
      document.getElementById("overview").replaceChildren(h("p", { class: "muted" }, `No perf_summary.json under ${data.logdir}.`));
      return;
    }
    select.replaceChildren(...state.runs.map((r) => h("option", { value: r.name }, r.error ? `${r.name} (unreadable)` : runTitle(r))));
    // a link can open a run: index.html?run=exp/version_0
    const asked = new URLSearchParams(document.location.search).get("run");
    state.run = state.runs.some((r) => r.name === asked) ? asked : state.runs[0].name;
    select.value = state.run;
    select.addEventListener("change", () => {
      state.run = select.value;
      state.overview = null;
      openPane(state.pane);
    });
    document.querySelectorAll("nav button").forEach((b) => b.addEventListener("click", () => openPane(b.dataset.pane)));
    await openPane("overview");
    // ms from the page's navigation to its first Overview: what a person waits for (read by the tests)
    document.body.dataset.firstPaintMs = String(Math.round(performance.now()));
  } catch (err) {
    showError(document.getElementById("overview"), err);
  }
}

main();
