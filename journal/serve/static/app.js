// ilab-journal serve: the page. Every string from a record is put in the page as text
// (textContent, text nodes, attributes set one by one): never parsed as HTML.
// No build step: plain script, uPlot vendored beside it.
"use strict";

const POLL_MS = 400;
// Each run's colour in compare, by its place in the address (the same on every chart, the
// legend and the table), and a run page's curves in one chart (loss, then val_loss). None
// is a marker's colour, nor near the lines' (save blue, leased teal, best gold, command
// red, ...): a curve never reads as a marker. In compare a run's lines take its colour.
const RUN_COLORS = ["#2ca02c", "#4527a0", "#d95f02", "#aa4499", "#827717", "#56b4e9",
  "#a6761d", "#882255"];
// Fewer points than this are drawn as they are, never smoothed (an average of 4 evals
// read 0.09 where the value was 0.224).
const MIN_SMOOTHED = 10;
// Values beyond this are drawn at it, the chart saying so (uPlot drew nothing of a range
// that overflows: 1.7e308 and -1.7e308); tick steps 1, 2, 2.5, 5 per decade as uPlot's
// own, on past its last (5e31) to the largest values.
const CLIP = 1e307;
const INCRS = [];
for (let e = -32; e < 308; e++) for (const m of e < 32 ? [1, 2, 2.5, 5] : [1, 2, 5]) INCRS.push(Number(m + "e" + e));
// The newest rows the tables show (a long run has thousands; /api/ has them all).
const STORY_ROWS = 500;
const TABLE_ROWS = 500;
// What a marker looks like: /api/config's table (journal/serve/marks.py), set at start.
let MARKS = { rows: [], kinds: {}, fates: {} };

// -- small helpers -----------------------------------------------------------------------

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (k === "className") node.className = v;
    else if (k.startsWith("on")) node[k] = v;
    else node.setAttribute(k, String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

// A box that scrolls sideways when its table is wider than the window, saying so.
function scrollBox(table) {
  const note = el("div", { className: "muted scroll-note", hidden: "" }, "⇆ wider than the window: scroll sideways for more columns");
  const box = el("div", { className: "scroll" }, table);
  const check = () => { note.hidden = box.scrollWidth <= box.clientWidth; };
  const watch = new ResizeObserver(check);
  watch.observe(box);
  watch.observe(table);
  return el("div", {}, note, box);
}

function token() {
  const params = new URLSearchParams(location.search);
  if (params.has("token")) {
    sessionStorage.setItem("ilab-token", params.get("token"));
    params.delete("token");
    const rest = params.toString();
    history.replaceState(null, "", location.pathname + (rest ? "?" + rest : ""));
  }
  return sessionStorage.getItem("ilab-token");
}

async function getJSON(url) {
  const r = await fetch(url, { cache: "no-store" });
  if (!r.ok) {
    // the server's one-line reason when it gave one ("cannot read journal.jsonl: ...")
    const why = await r.json().then((b) => b.error, () => null);
    throw new Error(why || url + ": " + r.status);
  }
  return r.json();
}

// -- numbers -----------------------------------------------------------------------------

// Whether a value reads best in exponent form (5.83e-4, 1.2e7).
const tiny = (v) => v !== 0 && (Math.abs(v) < 1e-3 || Math.abs(v) >= 1e6);

// A value in 3 significant digits: 0.000583 reads 5.83e-4, never 0.001 or 0. `exp`: in
// exponent form whatever its size (one axis' ticks all in one form).
function num(v, sig = 3, exp = undefined) {
  if (typeof v !== "number") return v === null || v === undefined ? "–" : String(v);
  if (!Number.isFinite(v)) return String(v);
  if (v === 0) return "0";
  if (exp === undefined ? tiny(v) : exp) {
    return v.toExponential(sig - 1).replace(/\.?0+e/, "e").replace("e+", "e");
  }
  return String(Number(v.toPrecision(sig)));
}

// Tick labels: 3 significant digits, more where two ticks would read the same; in one
// form per axis (1e-3, 7.5e-4, 5e-4: not 0.001 beside 7.5e-4).
function tickLabels(splits, log) {
  const shown = (v) => {
    if (v === null || v === undefined) return false;
    if (!log) return true;
    const m = Math.abs(v) / Math.pow(10, Math.floor(Math.log10(Math.abs(v)) + 1e-9));
    return [1, 2, 5].some((k) => Math.abs(m - k) < 1e-6);  // log axes: 1, 2, 5 per decade
  };
  const exp = splits.some((v) => shown(v) && tiny(v));
  for (let sig = 3; sig <= 12; sig++) {
    const out = splits.map((v) => (shown(v) ? num(v, sig, exp) : ""));
    const named = out.filter((t) => t !== "");
    if (new Set(named).size === named.length) return out;
  }
  return splits.map((v) => String(v));
}

// A value in a table or text: whole numbers as they are, rates (digits 0) as 63,410.
function fmt(v, digits) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "number") {
    // a rate in whole units reads alike whether the journal wrote 4096 or 4096.3: "4,096"
    if (digits === 0) return Math.round(v).toLocaleString("en-US");
    if (Number.isInteger(v)) return String(v);
    return num(v);
  }
  return String(v);
}

function duration(s) {
  if (s === null || s === undefined) return "–";
  if (s < 90) return Math.round(s) + "s";
  if (s < 5400) return Math.round(s / 60) + "m";
  return (s / 3600).toFixed(1) + "h";
}

function stateBadge(state, meaning) {
  return el("span", { className: "state state-" + String(state).replace(/[^a-z]/g, ""),
    title: meaning || "" }, state);
}

// A run's alerts at a glance, one mark per kind ("⚠ hung", "⚠ diverged"), after its state.
function alertMarks(s) {
  return (s.alert_kinds || []).map((k) => el("span", { className: "alert-mark", "data-kind": k,
    title: s.last_alert ? s.last_alert.kind + ": " + s.last_alert.message : "" }, "⚠ " + (k === "hang" ? "hung" : k)));
}

// Who watches the run for hangs and deaths, and when each last looked (docs/alerts.md).
function guardsText(guards) {
  return (guards || []).map((g) => g.source + " on " + g.host + " (pid " + g.pid + ") looked "
    + duration(g.age_s) + " ago" + (g.age_s >= 30 ? ": gone?" : "")).join("; ") || "none";
}

function swatch(color, extra) {
  const i = el("i", { className: "swatch" + (extra ? " " + extra : ""), "data-color": color });
  i.style.background = color;
  return i;
}

// -- markers: what they say, and how they look ----------------------------------------------

// A Unix time as the machine's local time, to the second: 2026-11-29 07:31:02.
const when = (ts) => new Date(ts * 1000).toLocaleString("sv-SE");

function markerText(m) {
  const lines = [m.event + " at step " + fmt(m.step) + (m.attempt ? " (attempt " + m.attempt + ")" : "")];
  if (m.ts) lines.push(when(m.ts));
  for (const [k, v] of Object.entries(m.detail || {})) {
    lines.push(k + ": " + (k.endsWith("_at") && typeof v === "number" ? when(v) : fmt(v)));
  }
  return lines.join("\n");
}

// An alert's row: its kind and message, who was told (or is being told) and when.
function alertText(d) {
  const told = d.told === undefined ? (d.targets ? "telling " + d.targets : "no --notify target")
    : "told " + d.told + (d.told_at ? " at " + when(d.told_at) : "");
  return d.kind + " alert: " + fmt(d.message) + "; raised " + (d.raised_at ? when(d.raised_at) : "–") + "; " + told;
}

function markerSummary(m) {
  const d = m.detail || {};
  switch (m.kind) {
    case "save": return "saved " + fmt(d.checkpoint_path) + (d.trigger ? " (" + d.trigger + ")" : "");
    case "removed": return "removed " + fmt(d.checkpoint_path) + ": " + fmt(d.reason);
    case "kept": return "kept " + fmt(d.checkpoint_path) + ": " + fmt(d.reason);
    case "evaluate": return "evaluated: val_loss " + fmt(d.val_loss);
    case "report": return "report for step " + fmt(d.step) + ": " + fmt(d.metrics) + " from " + fmt(d.source);
    case "control":
      if (d.command === undefined) return "refused: " + fmt(d.reason);
      return d.command + (d.accepted === false ? " refused" : " applied at step " + fmt(d.applied_at_step))
        + " from " + fmt(d.source) + (d.reason ? ": " + d.reason : "") + (d.error ? " (" + d.error + ")" : "");
    case "attempt": return "attempt " + fmt(d.attempt) + (d.resumed_from ? " resumed from " + d.resumed_from : " started");
    case "end": return "train_end: " + fmt(d.status) + (d.reason ? ": " + d.reason : "");
    case "alert": return alertText(d);
    case "job": return "job " + fmt(d.job_id) + " " + fmt(d.state) + (d.node ? " on " + d.node : "")
      + (d.exit_code !== undefined && d.exit_code !== null ? " exit " + d.exit_code : "");
    default: return m.event;
  }
}

// A kind the table does not know yet still shows (grey, in the last row).
const UNKNOWN_MARK = { color: "#9e9e9e", name: "grey", label: "other", row: "run", line: false, z: 0, dash: false };

// The look of one marker: a save's by its checkpoint's fate, any other by its kind. The
// key names the legend entry ("fate:best", "kind:control").
function markLook(m, fate) {
  if (m.kind === "save" && fate && MARKS.fates[fate]) return { key: "fate:" + fate, ...MARKS.fates[fate] };
  return { key: "kind:" + m.kind, ...(MARKS.kinds[m.kind] || { ...UNKNOWN_MARK, label: m.kind }) };
}

// The last part of a path as the page names a checkpoint ("runs/b/checkpoints/step-30/").
function baseName(path) {
  return typeof path === "string" ? path.replace(/\/+$/, "").split("/").pop() : "";
}

const tip = () => document.getElementById("tip");
function showTip(text, ev) {
  const t = tip();
  t.textContent = text;
  t.hidden = false;
  const w = Math.min(520, window.innerWidth - 16);
  t.style.left = Math.max(4, Math.min(ev.clientX + 12, window.innerWidth - w - 8)) + "px";
  t.style.top = (ev.clientY + 14) + "px";
}
function hideTip() { tip().hidden = true; }

// One run as the charts see it: its curves, markers and what became of its checkpoints.
class RunData {
  constructor(key, snap, color) {
    this.key = key;
    this.color = color;
    this.series = new Map(snap.series.map((s) => [s.name, s]));
    this.order = snap.series.map((s) => s.name);  // the server's order: updates' `n`
    this.markers = snap.markers;
    this.showMarkers = true;
    this.setCheckpoints(snap.checkpoints);
  }

  setCheckpoints(rows) {
    this.checkpoints = rows;
    // by name: a record may spell a checkpoint's path another way (relative, ./, a slash)
    this.fates = new Map(rows.map((r) => [r.name, r.best ? "best"
      : r.state === "removed" || r.state === "missing" ? "removed" : r.state === "leased" ? "leased" : "on_disk"]));
    this.lines = null;
  }

  fate(m) {
    return m.kind === "save" ? this.fates.get(baseName((m.detail || {}).checkpoint_path)) || "on_disk" : "";
  }

  // The markers drawn as lines across the charts, lowest first (the best drawn last, on top).
  lineMarkers() {
    if (this.lines === null) {
      this.lines = [];
      for (const m of this.markers) {
        if (m.step === null) continue;
        const look = markLook(m, this.fate(m));
        if (look.line) this.lines.push({ step: m.step, look });
      }
      this.lines.sort((a, b) => a.look.z - b.look.z);
    }
    return this.lines;
  }

  addMarkers(ms) {
    this.markers = this.markers.concat(ms);
    this.lines = null;
  }
}

// -- the runs list -------------------------------------------------------------------------

async function runsPage(main) {
  document.getElementById("title").textContent = "runs";
  const table = el("table", { id: "runs" });
  const compare = el("button", { id: "compare", onclick: () => {
    const keys = [...table.querySelectorAll("input:checked")].map((c) => c.value);
    if (keys.length) location.href = "/compare?" + keys.map((k) => "run=" + encodeURIComponent(k)).join("&");
  } }, "compare selected");
  const none = el("p", { id: "no-runs", className: "muted", hidden: "" },
    "no run yet: the list shows each run when its journal appears");
  main.replaceChildren(scrollBox(table), none, el("p", {}, compare));
  const head = el("tr", {}, ...["", "run", "state", "reason", "step", "tokens/s", "ETA", "best",
    "last record"].map((h) => el("th", {}, h)));
  async function draw() {
    const checked = new Set([...table.querySelectorAll("input:checked")].map((c) => c.value));
    const body = (await getJSON("/api/runs")).runs;
    const rows = body.map((r) => {
      const box = el("input", { type: "checkbox", value: r.key });
      box.checked = checked.has(r.key);
      const best = r.best ? r.best.metric + " " + fmt(r.best.value) + " @ " + fmt(r.best.step) : "–";
      return el("tr", { className: r.stale ? "stale run" : "run", "data-key": r.key },
        el("td", {}, box),
        el("td", {}, el("a", { href: "/run/" + encodeURIComponent(r.key) }, r.key),
          el("div", { className: "muted path" }, r.source)),
        el("td", {}, stateBadge(r.state, r.meaning), ...alertMarks(r), el("div", { className: "muted" }, r.meaning)),
        el("td", { className: "text" }, r.reason || ""),
        el("td", { className: "num" }, fmt(r.step) + " / " + fmt(r.total_steps)),
        el("td", { className: "num" }, fmt(r.tokens_per_s, 0)),
        el("td", { className: "num" }, duration(r.eta_s)),
        el("td", {}, best),
        el("td", { className: "num" }, duration(r.age_s) + " ago"));
    });
    table.replaceChildren(head, ...rows);
    table.dataset.loaded = String(body.length);
    none.hidden = body.length > 0;
  }
  await draw();
  window.ilabPaintMs = performance.now();
  document.body.dataset.painted = "1";
  // a parent dir is looked at again on each ask: a run started since appears
  setInterval(() => draw().catch(() => {}), 1000);
}

// -- charts ------------------------------------------------------------------------------

// The order of the charts: the loss with val_loss, the evaluations and reported results,
// then lr, grad_norm and throughput, then the rest by name.
const AFTER_EVALS = ["lr", "grad_norm", "tokens_per_s", "samples_per_s"];
function curveRank(name) {
  if (name === "loss") return 0;
  if (name === "val_loss") return 1;
  if (name.startsWith("val_") || name.startsWith("eval") || name.startsWith("report:")) return 2;
  const i = AFTER_EVALS.indexOf(name);
  return i >= 0 ? 3 + i : 10;
}
const byRank = (a, b) => curveRank(a) - curveRank(b) || (a < b ? -1 : a > b ? 1 : 0);

// A curve that never changed (two points or more, one value): a line of text, not a chart.
function isConstant(s) {
  if (!s || s.y.length < 2) return false;
  for (let i = 1; i < s.y.length; i++) if (s.y[i] !== s.y[0]) return false;
  return true;
}

// TensorBoard's smoothing: an exponential moving average, debiased at the start.
function ema(y, w) {
  const out = new Array(y.length);
  let last = 0, n = 0;
  for (let i = 0; i < y.length; i++) {
    const v = y[i];
    if (v === null || !Number.isFinite(v)) { out[i] = v; continue; }
    last = last * w + (1 - w) * v;
    n += 1;
    out[i] = last / (1 - Math.pow(w, n));
  }
  return out;
}

function faint(hex) { return hex + "40"; }  // the raw curve behind a smoothed one

// The x range when not zoomed: the curves', widened to the markers (a train_end after
// the last logged step).
function stepRange(view, lo, hi) {
  for (const r of view.runs) {
    if (!r.showMarkers) continue;
    for (const m of r.markers) {
      if (m.step === null) continue;
      if (lo === null || m.step < lo) lo = m.step;
      if (hi === null || m.step > hi) hi = m.step;
    }
  }
  if (lo === null) return [0, 1];
  return lo === hi ? [lo - 1, hi + 1] : [lo, hi];
}

function drawMarkerLines(u, view) {
  const ctx = u.ctx;
  const left = u.bbox.left, right = u.bbox.left + u.bbox.width;
  const drawn = new Set();
  ctx.save();
  for (const r of view.runs) {
    if (!r.showMarkers) continue;
    for (const { step, look } of r.lineMarkers()) {
      const x = Math.round(u.valToPos(step, "x", true));
      if (x < left || x > right) continue;
      ctx.strokeStyle = view.byRun ? r.color : look.color;  // compare: whose line it is
      drawn.add(ctx.strokeStyle);
      ctx.lineWidth = (look.z >= 7 ? 3 : 1.5) * devicePixelRatio;
      ctx.setLineDash(look.dash ? [4 * devicePixelRatio, 4 * devicePixelRatio] : []);
      ctx.beginPath();
      ctx.moveTo(x, u.bbox.top);
      ctx.lineTo(x, u.bbox.top + u.bbox.height);
      ctx.stroke();
    }
  }
  ctx.restore();
  u.root.parentNode.dataset.lines = [...drawn].join(",");
}

// One chart's table for uPlot: x, then per curve its values (with smoothing: the raw
// values, then the smoothed ones); a log axis takes no value <= 0.
function chartData(view, spec) {
  const tables = spec.curves.map((c) => {
    const s = view.curve(c.run, c.name);
    let y = s ? s.y : [];
    if (spec.log) y = y.map((v) => (v > 0 ? v : null));
    if (spec.clipped) y = y.map((v) => (v === null ? v : Math.max(-CLIP, Math.min(CLIP, v))));
    return c.smooth ? [s ? s.x : [], y, ema(y, view.smooth)] : [s ? s.x : [], y];
  });
  return tables.length === 1 ? tables[0] : uPlot.join(tables);
}

// An axis' tick labels, kept on the chart's node too (what is drawn, for the tests).
function ticksOf(node, attr, splits, log) {
  const labels = tickLabels(splits, log);
  node.dataset[attr] = labels.join("|");
  return labels;
}

function makeChart(node, spec, view, width, height) {
  const series = [{ label: "step", value: (u, v) => (v === null ? "–" : fmt(v)) }];
  for (const c of spec.curves) {
    const s = view.curve(c.run, c.name);
    const few = s && s.x.length < 60;
    const value = (u, v) => (v === null || v === undefined ? "–" : num(v));
    if (c.smooth) {
      series.push({ label: c.label + " raw", stroke: faint(c.color), width: 1, spanGaps: true,
        points: { show: false }, value });
    }
    series.push({ label: c.label, stroke: c.color, width: 1.5, spanGaps: true,
      points: { show: few }, value });
  }
  const opts = {
    width, height,
    cursor: {
      sync: { key: view.syncKey, filters: { pub: (type) => type === "mousemove" || type === "mouseleave" || type === "mouseenter" } },
      drag: { x: true, y: false, setScale: false },  // the page zooms every chart itself
      bind: { dblclick: () => null },
    },
    scales: {
      x: { time: false, range: (u, lo, hi) => (view.zoom ? [view.zoom[0], view.zoom[1]] : stepRange(view, lo, hi)) },
      y: spec.log ? { distr: 3, log: 10 } : {},
    },
    series,
    axes: [
      { values: (u, splits) => ticksOf(node, "xticks", splits, false) },
      { size: 60, values: (u, splits) => ticksOf(node, "yticks", splits, spec.log), ...(spec.log ? {} : { incrs: INCRS }) },
    ],
    hooks: {
      draw: [(u) => drawMarkerLines(u, view)],
      setSelect: [(u) => {
        if (u.select.width < 3) return;
        const lo = u.posToVal(u.select.left, "x"), hi = u.posToVal(u.select.left + u.select.width, "x");
        u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
        view.zoomTo(Math.floor(lo), Math.ceil(hi));  // whole steps
      }],
      setScale: [(u, key) => {
        if (key !== "x") return;
        node.dataset.xmin = String(u.scales.x.min);
        node.dataset.xmax = String(u.scales.x.max);
      }],
      setData: [(u) => { node.dataset.points = String(u.data[0].length); }],
    },
  };
  const u = new uPlot(opts, chartData(view, spec), node);
  u.over.addEventListener("dblclick", () => view.zoomTo(null));
  node.dataset.points = String(u.data[0].length);
  node.dataset.colors = spec.curves.map((c) => c.label + "=" + c.color).join(",");
  node.dataset.scale = spec.log ? "log" : "linear";
  node.dataset.smoothing = String(view.smooth);
  return u;
}

// The controls over every chart: a filter on metric names, smoothing, zoom out.
function chartControls(view) {
  const filter = el("input", { type: "search", id: "filter", placeholder: "filter metrics (regex)",
    "aria-label": "filter metrics" });
  filter.oninput = () => { view.filter = filter.value; view.applyFilter(); };
  const smooth = el("input", { type: "range", id: "smoothing", min: "0", max: "0.99", step: "0.01",
    value: String(view.smooth), "aria-label": "smoothing" });
  const shown = el("span", { id: "smoothing-value", className: "num" }, view.smooth.toFixed(2));
  let frame = 0;
  smooth.oninput = () => {
    view.smooth = Number(smooth.value);
    shown.textContent = view.smooth.toFixed(2);
    cancelAnimationFrame(frame);
    frame = requestAnimationFrame(() => view.build());
  };
  const reset = el("button", { id: "zoom-out", onclick: () => view.zoomTo(null), hidden: "" }, "zoom out");
  view.zoomButton = reset;
  return el("div", { className: "chart-controls" },
    el("label", {}, filter),
    el("label", {}, "smoothing ", smooth, " ", shown),
    reset,
    el("span", { className: "muted hint" }, "drag to zoom, double-click to zoom out"));
}

// The charts of one or more runs, with zoom, smoothing, log axes, the filter and the
// constant curves folded into one row. `specsOf(view)` says which charts to draw.
class ChartView {
  constructor(host, runs, specsOf, opts) {
    this.host = host;
    this.runs = runs;
    this.specsOf = specsOf;
    this.syncKey = "ilab-" + Math.random().toString(36).slice(2);
    this.charts = [];
    this.zoom = null;
    this.zoomData = new Map();
    this.smooth = 0;
    this.logs = new Set();
    this.filter = "";
    this.forced = new Set();  // constant curves asked to be drawn
    this.pinned = [];  // listed curves asked for by name: read once, not followed live
    this.strips = opts.strips;  // (view) -> placed strips, after each layout
    this.byRun = Boolean(opts.byRun);  // compare: a run's marker lines in its colour
    this.constRow = el("div", { className: "more-row", id: "constant", hidden: "" });
    this.grid = el("div", { id: "charts" });
    this.none = el("p", { className: "muted", id: "no-match", hidden: "" });
    host.append(this.constRow, this.none, this.grid);
    let last = window.innerWidth;
    window.addEventListener("resize", () => {
      clearTimeout(this.resizeTimer);
      this.resizeTimer = setTimeout(() => { if (window.innerWidth !== last) { last = window.innerWidth; this.build(); } }, 150);
    });
  }

  run(key) { return this.runs.find((r) => r.key === key); }

  curve(key, name) {
    const z = this.zoom && this.zoomData.get(key + "\u0000" + name);
    if (z) return z;
    const r = this.run(key);
    return (r && r.series.get(name)) || this.pinned.find((p) => p.run === key && p.name === name);
  }

  width() { return Math.max(200, Math.floor(this.grid.clientWidth || this.host.clientWidth) - 2); }

  // Every chart again (curves, smoothing, log axes, width), keeping the zoom.
  build() {
    for (const c of this.charts) c.u.destroy();
    this.charts = [];
    this.grid.replaceChildren();
    const { specs, constants } = this.specsOf(this);
    const full = this.width();
    const cols = Math.max(1, Math.min(3, Math.floor(full / 520)));
    const cell = Math.floor((full - 12 * (cols - 1)) / cols) - 2;
    specs.forEach((spec, i) => {
      // a log axis needs a value above 0 to show
      spec.log = this.logs.has(spec.key) && spec.curves.some((c) => {
        const s = this.curve(c.run, c.name);
        return s && s.y.some((v) => v > 0);
      });
      for (const c of spec.curves) {
        const s = this.curve(c.run, c.name);
        c.smooth = this.smooth > 0 && s && s.x.length >= MIN_SMOOTHED;
        spec.clipped = spec.clipped || (s && s.y.some((v) => Math.abs(v) > CLIP));
      }
      const first = i === 0;
      const box = el("div", { className: "chart-box" + (first ? " first" : ""), "data-key": spec.key });
      const log = el("input", { type: "checkbox", className: "log", "aria-label": "log scale" });
      log.checked = spec.log;
      log.onchange = () => {
        if (log.checked) this.logs.add(spec.key); else this.logs.delete(spec.key);
        this.build();
      };
      box.append(el("div", { className: "chart-head" }, el("span", { className: "chart-title" }, spec.title),
        spec.clipped ? el("span", { className: "clipped" }, "values beyond ±1e307 drawn at ±1e307") : null,
        el("label", { className: "log-toggle" }, log, " log")));
      const node = el("div", { className: "chart", "data-curves": spec.curves.map((c) => c.label).join(","),
        "data-metric": spec.metric || spec.key });
      box.append(node);
      this.grid.append(box);
      const u = makeChart(node, spec, this, first ? full : cell, first ? 240 : 180);
      this.charts.push({ spec, u, box });
    });
    this.renderConstants(constants);
    this.applyFilter();
    this.placeStrips();
  }

  // The strips after uPlot has laid the charts out: it does so in a microtask (queued
  // before this one), and positions on the x axis are known only then.
  placeStrips() {
    queueMicrotask(() => this.strips(this));
  }

  renderConstants(constants) {
    this.constRow.replaceChildren(el("span", { className: "muted" }, "constant: "),
      ...constants.map((c) => el("button", { className: "metric const", "data-name": c.name,
        title: "draw it", onclick: () => { this.forced.add(c.name); this.build(); } },
      c.name + " = " + c.text)));
  }

  applyFilter() {
    let re = null;
    try { re = this.filter ? new RegExp(this.filter, "i") : null; } catch (e) { re = null; }
    const want = this.filter.toLowerCase();
    const hit = (name) => !this.filter || (re ? re.test(name) : name.toLowerCase().includes(want));
    for (const c of this.charts) c.box.hidden = !c.spec.names.some(hit);
    const consts = [...this.constRow.querySelectorAll("button")];
    for (const b of consts) b.hidden = !hit(b.dataset.name);
    this.constRow.hidden = consts.every((b) => b.hidden);
    const shown = this.charts.filter((c) => !c.box.hidden).length;
    this.grid.dataset.shown = String(shown);
    this.none.hidden = shown > 0 || !this.constRow.hidden;
    this.none.textContent = "no metric matches “" + this.filter + "”";
  }

  // Zoom every chart to [lo, hi] (null: out), then fetch that range at full resolution.
  zoomTo(lo, hi) {
    this.zoom = lo === null ? null : [Math.min(lo, hi), Math.max(lo, hi)];
    this.zoomData = new Map();
    this.zoomButton.hidden = this.zoom === null;
    this.grid.dataset.zoom = this.zoom ? this.zoom.join(",") : "";
    delete this.grid.dataset.fetched;
    this.redrawAll(true);
    if (this.zoom) this.fetchZoom(this.zoom);
  }

  async fetchZoom(zoom) {
    const want = new Map();
    for (const c of this.charts) {
      for (const cv of c.spec.curves) want.set(cv.run + "\u0000" + cv.name, { ...cv, width: c.u.width });
    }
    const got = await Promise.all([...want.entries()].map(([k, cv]) =>
      getJSON("/api/runs/" + encodeURIComponent(cv.run) + "/series?name=" + encodeURIComponent(cv.name)
        + "&lo=" + zoom[0] + "&hi=" + zoom[1] + "&width=" + Math.max(100, Math.round(cv.width)))
        .then((s) => [k, s], () => [k, null])));
    if (this.zoom !== zoom) return;  // zoomed elsewhere meanwhile
    for (const [k, s] of got) if (s) this.zoomData.set(k, s);
    this.redrawAll(true);
    this.grid.dataset.fetched = zoom.join(",");
  }

  // New data in every chart: with `rescale`, the x range again (zoomed or whole).
  redrawAll(rescale) {
    for (const c of this.charts) c.u.setData(chartData(this, c.spec), rescale);
    this.placeStrips();
  }
}

// A strip of markers above the charts, for one run, aligned with the first chart's x axis:
// one row per kind of thing (marks.py's rows), marks within 3 px of each other one mark,
// the highest (the best save) naming it and drawn on top.
function placeStrip(strip, run, u) {
  strip.replaceChildren();
  const present = new Set(run.markers.map((m) => (MARKS.kinds[m.kind] || UNKNOWN_MARK).row));
  const rows = MARKS.rows.filter((row) => present.has(row));
  strip.style.height = (4 + 12 * Math.max(1, rows.length)) + "px";
  strip.dataset.count = String(run.markers.length);
  if (!u) return;
  strip.style.width = (u.width) + "px";
  const left = u.bbox.left / devicePixelRatio;
  const plotW = u.bbox.width / devicePixelRatio;
  rows.forEach((row, i) => {
    const label = el("span", { className: "strip-row" }, row);
    label.style.top = (2 + 12 * i) + "px";
    label.style.width = (left - 6) + "px";
    strip.append(label);
  });
  const groups = new Map();
  for (const m of run.markers) {
    if (m.step === null) continue;
    const x = u.valToPos(m.step, "x");
    if (x < 0 || x > plotW) continue;
    const fate = run.fate(m);
    const look = markLook(m, fate);
    const key = look.row + "/" + Math.round(x / 3);
    const g = groups.get(key);
    if (!g) groups.set(key, { top: m, look, fate, x, all: [m] });
    else {
      g.all.push(m);
      if (look.z >= g.look.z) Object.assign(g, { top: m, look, fate });
    }
  }
  for (const g of groups.values()) {
    const { top: m, look, fate } = g;
    const node = el("span", { className: "marker kind-" + m.kind + (fate ? " ck-" + fate : ""),
      "data-kind": m.kind, "data-step": m.step, "data-state": fate, "data-n": g.all.length,
      "data-look": look.key });
    node.style.left = (left + g.x) + "px";
    node.style.top = (2 + 12 * Math.max(0, rows.indexOf(look.row))) + "px";
    node.style.background = look.color;
    node.style.zIndex = String(look.z);
    let text = markerText(m) + (fate ? "\ncheckpoint: " + MARKS.fates[fate].label : "");
    if (g.all.length > 1) {
      const counts = new Map();
      for (const x of g.all) {
        const k = markLook(x, run.fate(x)).label;
        counts.set(k, (counts.get(k) || 0) + 1);
      }
      text = g.all.length + " records here: " + [...counts].map(([k, n]) => n + " " + k).join(", ")
        + "; the top one:\n" + text;
    }
    node.addEventListener("mouseenter", (ev) => showTip(text, ev));
    node.addEventListener("mouseleave", hideTip);
    strip.append(node);
  }
}

// The legend of the markers: every kind and save fate drawn, in the colours drawn.
function renderLegend(legend, runs) {
  const seen = new Map();
  for (const run of runs) {
    if (!run.showMarkers) continue;
    for (const m of run.markers) {
      const look = markLook(m, run.fate(m));
      if (!seen.has(look.key)) seen.set(look.key, look);
    }
  }
  const order = [...Object.keys(MARKS.fates).map((f) => "fate:" + f), ...Object.keys(MARKS.kinds).map((k) => "kind:" + k)];
  const keys = [...seen.keys()].sort((a, b) => {
    const ia = order.indexOf(a), ib = order.indexOf(b);
    return (ia < 0 ? 999 : ia) - (ib < 0 ? 999 : ib);
  });
  legend.replaceChildren(...keys.map((k) => {
    const look = seen.get(k);
    return el("span", { className: "legend-item", "data-look": k, "data-color": look.color },
      swatch(look.color, look.z >= 7 ? "best" : ""), look.label);
  }));
}

// -- the run page --------------------------------------------------------------------------

async function runPage(main, key) {
  const cfg = await getJSON("/api/config");
  MARKS = cfg.marks;
  const base = "/api/runs/" + encodeURIComponent(key);
  const snap = await getJSON(base + "?width=1000");
  document.getElementById("title").textContent = key;
  const run = new RunData(key, snap, RUN_COLORS[0]);
  const facts = el("div", { className: "facts", id: "facts" });
  const legend = el("div", { className: "legend-keys", id: "legend" });
  const strip = el("div", { className: "strip", id: "strip" });
  const charts = el("div", { className: "charts-host" });
  const more = el("details", { id: "more" });
  const ckTable = el("table", { id: "checkpoints" });
  const story = el("table", { id: "story" });
  const control = cfg.control ? controlPanel(base, snap) : null;
  main.replaceChildren(facts);
  if (control) main.append(control.node);
  main.append(legend, strip, charts, more, el("h2", {}, "Checkpoints"), scrollBox(ckTable),
    el("h2", {}, "Story"), scrollBox(story));

  const view = new ChartView(charts, [run], runSpecs, {
    strips: (v) => placeStrip(strip, run, v.charts.length ? v.charts[0].u : null),
  });
  charts.prepend(chartControls(view));
  let leases = snap.leases;
  let count = snap.count;
  const pin = async (name) => {
    const s = await getJSON(base + "/series?name=" + encodeURIComponent(name) + "&width=1000");
    view.pinned = view.pinned.filter((p) => p.name !== name).concat([{ ...s, run: key }]);
    view.build();
  };
  const renderMore = (listed, all) => {
    more.hidden = listed.length === 0;
    more.dataset.n = String(listed.length);
    more.replaceChildren(el("summary", {}, listed.length + (all ? "" : "+")
      + " more metrics without a chart: click one to draw it"),
      ...listed.map((n) => el("button", { className: "metric", "data-name": n,
        onclick: () => pin(n).catch(() => {}) }, n)));
  };
  view.build();
  renderLegend(legend, [run]);
  renderMore(snap.listed || [], snap.listed_all);
  renderFacts(facts, snap.summary);
  if (control) control.update(snap.summary, run.markers);
  // the tables after the curves are on screen (a long run has thousands of rows)
  setTimeout(() => {
    renderCheckpoints(ckTable, run.checkpoints);
    renderStory(story, run.markers, true);
    document.body.dataset.tables = "1";
  }, 0);

  let layout = layoutKey(view);
  async function poll() {
    try {
      const n = run.order.map((name) => run.series.get(name).n).join(",");
      const up = await getJSON(base + "/updates?since=" + count + "&n=" + n + "&m=" +
        run.markers.length + "&width=1000&leases=" + encodeURIComponent(leases || ""));
      count = up.count;
      leases = up.leases;
      renderFacts(facts, up.summary);
      let rebuild = false;
      for (const s of up.series) {
        const have = run.series.get(s.name);
        if (!have) { run.series.set(s.name, s); run.order.push(s.name); rebuild = true; continue; }
        if (s.reset) Object.assign(have, s);
        else { have.x = have.x.concat(s.x); have.y = have.y.concat(s.y); have.n = s.n; }
      }
      let marks = false;
      if (up.checkpoints) {
        run.setCheckpoints(up.checkpoints);
        renderCheckpoints(ckTable, run.checkpoints);
        marks = true;
      } else refreshLeases(ckTable);
      if (up.markers.length) { run.addMarkers(up.markers); renderStory(story, up.markers, false); marks = true; }
      for (const m of up.told) {  // who was told of an alert, come since: its row says so
        run.markers[m.i] = m;
        const row = story.querySelector("tr[data-i='" + m.i + "']");
        if (row) { row.cells[1].textContent = markerSummary(m); row.title = markerText(m); }
        marks = true;
      }
      if (control) control.update(up.summary, run.markers);
      if (up.listed) renderMore(up.listed, up.listed_all);
      const now = layoutKey(view);
      if (now !== layout) { layout = now; rebuild = true; }
      if (rebuild) view.build();
      else if (up.series.length || marks) {
        // a curve sent whole again while zoomed: the zoomed range is fetched anew
        if (view.zoom !== null && up.series.some((s) => s.reset)) view.fetchZoom(view.zoom);
        if (view.zoom === null) view.redrawAll(true);
        else { for (const c of view.charts) c.u.redraw(); view.placeStrips(); }
      }
      if (marks) renderLegend(legend, [run]);
      document.body.dataset.count = String(count);
    } catch (err) {
      console.error(err);  // the server went away for a moment: ask again
    } finally {
      setTimeout(poll, POLL_MS);
    }
  }
  document.body.dataset.count = String(count);
  window.ilabPaintMs = performance.now(); // since navigation start (bench_serve reads it)
  document.body.dataset.painted = "1";
  setTimeout(poll, POLL_MS);
}

// What lays the charts out besides the names: which curves are constant, which have points
// enough to smooth; a change draws them again.
function layoutKey(view) {
  return [...view.runs[0].series.values()].map((s) => (isConstant(s) ? "c" : "") + (s.x.length >= MIN_SMOOTHED ? "s" : "")).join(",");
}

// A run page's charts: the loss with val_loss, then one chart per other curve; curves that
// never changed folded into the "constant" row (the loss never is).
function runSpecs(view) {
  const run = view.runs[0];
  const names = [...run.series.keys()];
  const constants = [], drawn = [];
  for (const n of names) {
    const s = run.series.get(n);
    if (n !== "loss" && n !== "val_loss" && !view.forced.has(n) && isConstant(s)) {
      constants.push({ name: n, text: num(s.y[0]) + " (" + s.n + " points)" });
    } else drawn.push(n);
  }
  const groups = [];
  const lossy = ["loss", "val_loss"].filter((n) => drawn.includes(n));
  if (lossy.length) groups.push(lossy);
  for (const n of drawn.filter((n) => !lossy.includes(n)).sort(byRank)) groups.push([n]);
  for (const p of view.pinned) groups.push([p.name]);
  const specs = groups.map((g) => ({
    key: g.join(","), title: g.join(", "), names: g, metric: g[0],
    curves: g.map((n, i) => ({ run: run.key, name: n, label: n, color: RUN_COLORS[i % RUN_COLORS.length] })),
  }));
  return { specs, constants };
}

function renderFacts(facts, s) {
  const best = s.best ? s.best.metric + " " + fmt(s.best.value) + " at step " + fmt(s.best.step) : "–";
  facts.replaceChildren(
    el("p", {}, stateBadge(s.state, s.meaning), ...alertMarks(s), " ", el("span", { id: "reason" }, s.reason || ""),
      " ", el("span", { className: "muted" }, s.meaning)),
    el("p", {},
      el("span", {}, "run ", s.run_id || "–", " attempt ", fmt(s.attempt)),
      el("span", {}, "step ", el("b", { id: "step" }, fmt(s.step)), " / ", fmt(s.total_steps)),
      el("span", {}, "tokens/s ", fmt(s.tokens_per_s, 0)),
      el("span", {}, "ETA ", duration(s.eta_s)),
      el("span", {}, "best ", best),
      el("span", {}, "last record ", duration(s.age_s), " ago"),
      el("span", {}, "records ", fmt(s.records)),
      el("span", { id: "guards" }, "guards ", guardsText(s.guards))));
  facts.dataset.state = s.state;
  facts.dataset.step = String(s.step);
}

// A checkpoint's fate in words: on disk (kept, leased), or how it went.
function ckFate(r) {
  if (r.state === "removed") {
    const x = r.removed;
    return "removed at step " + fmt(x.step) + ": " + fmt(x.reason)
      + (x.by ? " (by " + x.by + (x.after_end ? ", after the end)" : ")") : x.after_end ? " (after the end)" : "");
  }
  if (r.state === "missing") return "no: gone without a removal record";
  return (r.state === "leased" ? "yes (leased)" : "yes") + (r.kept ? " (kept: " + r.kept + ")" : "");
}

// The leases held now, with the time each has left (read again on every poll).
function leaseText(leases) {
  const now = Date.now() / 1000;
  return leases.filter((l) => l.expires > now)
    .map((l) => l.holder + " (" + duration(l.expires - now) + " left)").join("; ");
}

function refreshLeases(table) {
  for (const td of table.querySelectorAll("td.leases")) {
    if (td._leases && td._leases.length) td.textContent = leaseText(td._leases);
  }
}

function renderCheckpoints(table, rows) {
  const head = el("tr", {}, ...["step", "checkpoint", "on disk", "leases", "reports", "jobs", "best"]
    .map((h) => el("th", {}, h)));
  // the newest rows and the best (a long run saves thousands of times; all are in /api/)
  const shown = rows.filter((r, i) => r.best || i >= rows.length - TABLE_ROWS);
  table.dataset.more = String(rows.length - shown.length);
  table.replaceChildren(head, ...shown.map((r) => {
    const leases = el("td", { className: "leases" }, leaseText(r.leases));
    leases._leases = r.leases;
    return el("tr", { "data-step": r.step, "data-on-disk": r.on_disk, "data-state": r.state,
      "data-best": r.best, className: "ckpt" },
    el("td", { className: "num" }, fmt(r.step)),
    el("td", { className: "name" }, r.name),
    el("td", { className: "text" }, ckFate(r)),
    leases,
    el("td", { className: "text" }, r.reports.map((p) => Object.entries(p.metrics).map(([k, v]) => k + "=" + fmt(v)).join(" ")
      + " from " + fmt(p.source)).join("; ")),
    el("td", { className: "text" }, r.jobs.map((j) => fmt(j.scheduler) + " " + fmt(j.job_id) + " " + fmt(j.state)
      + (j.node ? " on " + j.node : "") + (j.exit_code !== null ? " exit " + j.exit_code : "")).join("; ")),
    el("td", {}, r.best ? "★ best" : ""));
  }));
}

// The story's newest lines (every eval is a point on val_loss already); the rest is in
// /api/. Removals at one step for one reason are one line naming each checkpoint.
function renderStory(table, markers, fresh) {
  if (fresh) {
    table.replaceChildren(el("tr", {}, el("th", {}, "step"), el("th", {}, "what")));
    table._last = null;
    table._dropped = 0;
  }
  for (const m of markers) {
    if (m.kind === "evaluate") continue;
    const d = m.detail || {};
    const last = table._last;
    if (m.kind === "removed" && last && last.kind === "removed" && last.step === m.step
      && last.reason === d.reason && last.row.isConnected) {
      last.names.push(baseName(d.checkpoint_path));
      last.row.cells[1].textContent = "removed " + last.names.length + " checkpoints ("
        + last.names.join(", ") + "): " + fmt(d.reason);
      last.row.dataset.n = String(last.names.length);
      last.row.title += "\n\n" + markerText(m);
      continue;
    }
    const row = el("tr", { "data-kind": m.kind, "data-i": m.i }, el("td", { className: "num" }, fmt(m.step)),
      el("td", { className: "text" }, markerSummary(m)));
    row.title = markerText(m);
    table.append(row);
    table._last = { kind: m.kind, step: m.step, reason: d.reason, names: [baseName(d.checkpoint_path)], row };
  }
  while (table.rows.length > STORY_ROWS + 1) { table.rows[1].remove(); table._dropped += 1; }
  table.dataset.more = String(table._dropped);
}

// Stop / save / evaluate: live while the run runs; off, saying why, once it has ended.
function controlPanel(base, snap) {
  const reason = el("input", { type: "text", id: "control-reason", placeholder: "reason" });
  const said = el("span", { id: "control-said", className: "muted" });
  const buttons = ["stop", "save", "evaluate"].map((c) => el("button", { id: "control-" + c, onclick: () => send(c) }, c));
  let sent = null;  // the last command sent: its verdict is looked for in the markers
  let verdict = null;  // what became of it, in words
  async function send(command) {
    const r = await fetch(base + "/control", {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-Ilab-Token": token() || "" },
      body: JSON.stringify({ command, reason: reason.value || null }),
    });
    const body = await r.json();
    if (r.ok) { sent = { id: body.id, command }; verdict = null; }
    said.textContent = r.ok ? command + " sent (" + body.id + "): waiting for the trainer's next step"
      : "refused: " + body.error;
  }
  const node = el("div", { className: "control", id: "control" }, reason, " ", ...buttons, " ", said);
  function update(summary, markers) {
    const off = snap.remote ? "a mirrored run: steer it with ilab-journal control on its run dir"
      : summary.ended ? "the run has ended (" + summary.state + (summary.step !== null ? " at step " + summary.step : "")
        + "): it reads no more commands" : null;
    for (const b of buttons) b.disabled = off !== null;
    reason.disabled = off !== null;
    node.dataset.off = off === null ? "" : "1";
    if (sent) {
      const v = markers.find((m) => m.kind === "control" && (m.detail || {}).id === sent.id);
      if (v) {
        const d = v.detail;
        verdict = d.accepted === false ? sent.command + " refused: " + fmt(d.reason)
          : sent.command + " applied at step " + fmt(d.applied_at_step);
        said.textContent = verdict;
        sent = null;
      }
    }
    if (off && !sent) said.textContent = (verdict ? verdict + "; " : "") + off;
  }
  return { node, update };
}

// -- compare ---------------------------------------------------------------------------

async function comparePage(main) {
  const cfg = await getJSON("/api/config");
  MARKS = cfg.marks;
  const keys = [...new Set(new URLSearchParams(location.search).getAll("run"))];
  document.getElementById("title").textContent = "compare " + keys.join(", ");
  const snaps = await Promise.all(keys.map((k) => getJSON("/api/runs/" + encodeURIComponent(k) + "?width=800")));
  const runs = keys.map((k, i) => new RunData(k, snaps[i], RUN_COLORS[i % RUN_COLORS.length]));
  const head = el("table", { id: "compare-runs" });
  const legend = el("div", { className: "legend-keys", id: "legend" });
  const strips = el("div", { id: "strips" });
  const charts = el("div", { className: "charts-host" });
  main.replaceChildren(scrollBox(head), legend, strips, charts);
  const view = new ChartView(charts, runs, compareSpecs, {
    byRun: true,
    strips: (v) => {
      const u = v.charts.length ? v.charts[0].u : null;
      strips.replaceChildren();
      for (const r of runs) {
        if (!r.showMarkers) continue;
        const strip = el("div", { className: "strip", "data-run": r.key });
        strips.append(el("div", { className: "strip-name" }, swatch(r.color), r.key), strip);
        placeStrip(strip, r, u);
      }
      renderLegend(legend, runs);
    },
  });
  charts.prepend(chartControls(view));
  head.append(el("tr", {}, ...["", "run", "state", "step", "best", "last loss", "markers"].map((h) => el("th", {}, h))));
  runs.forEach((r, i) => {
    const s = snaps[i].summary;
    const box = el("input", { type: "checkbox", className: "markers", "data-run": r.key, "aria-label": "markers of " + r.key });
    box.checked = r.showMarkers;
    box.onchange = () => { r.showMarkers = box.checked; view.redrawAll(true); };
    const best = s.best ? s.best.metric + " " + fmt(s.best.value) + " @ " + fmt(s.best.step) : "–";
    head.append(el("tr", { className: "run", "data-key": r.key, "data-color": r.color },
      el("td", {}, swatch(r.color)),
      el("td", {}, el("a", { href: "/run/" + encodeURIComponent(r.key) }, r.key)),
      el("td", { className: "text" }, stateBadge(s.state, s.meaning), ...alertMarks(s), s.reason ? " " + s.reason : ""),
      el("td", { className: "num" }, fmt(s.step) + " / " + fmt(s.total_steps)),
      el("td", {}, best),
      el("td", { className: "num" }, fmt(s.last_loss)),
      el("td", {}, box)));
  });
  view.build();
  document.body.dataset.painted = "1";
}

// Compare's charts: one per metric, one line per run that has it, in the run's colour.
function compareSpecs(view) {
  const names = [...new Set(view.runs.flatMap((r) => [...r.series.keys()]))].sort(byRank);
  const specs = [], constants = [];
  for (const name of names) {
    const have = view.runs.filter((r) => r.series.has(name));
    const values = have.map((r) => r.series.get(name));
    if (name !== "loss" && !view.forced.has(name) && values.every(isConstant)
      && values.every((s) => s.y[0] === values[0].y[0])) {
      constants.push({ name, text: num(values[0].y[0]) + " (" + have.length + " runs)" });
      continue;
    }
    specs.push({ key: name, title: name, names: [name], metric: name,
      curves: have.map((r) => ({ run: r.key, name, label: r.key, color: r.color })) });
  }
  return { specs, constants };
}

// -- start -----------------------------------------------------------------------------

(async function start() {
  token();
  const main = document.getElementById("main");
  const path = location.pathname;
  try {
    if (path.startsWith("/run/")) await runPage(main, decodeURIComponent(path.slice(5)));
    else if (path === "/compare") await comparePage(main);
    else await runsPage(main);
  } catch (err) {
    main.replaceChildren(el("p", { id: "error" }, String(err)));
  }
})();
