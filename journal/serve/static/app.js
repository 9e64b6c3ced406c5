// ilab-journal serve: the page. Every string from a record is put in the page as text
// (textContent, text nodes, attributes set one by one): never parsed as HTML.
"use strict";

const POLL_MS = 400;
const COLORS = ["#2f7ed8", "#e53935", "#43a047", "#8e24aa", "#fb8c00", "#00897b", "#6d4c41"];
const KIND_COLORS = {
  save: "#2f7ed8", removed: "#999", kept: "#0aa", evaluate: "#8bc34a", report: "#9c27b0",
  control: "#e53935", attempt: "#000", end: "#6d4c41", job: "#ff9800", gap: "#f06292",
};
// The strip's rows: checkpoints, then results, then what steered or ended the run.
const STRIP_ROW = { save: 0, removed: 0, kept: 0, evaluate: 1, report: 1, job: 1, control: 2, gap: 2,
  attempt: 3, end: 3 };
const LINE_KINDS = new Set(["save", "control", "attempt", "end", "gap"]);

// -- small helpers -----------------------------------------------------------------------

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (k === "className") node.className = v;
    else if (k === "onclick" || k === "onchange") node[k] = v;
    else node.setAttribute(k, String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
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

function fmt(v, digits) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "number") {
    if (Number.isInteger(v)) return String(v);
    // digits 0: a rate such as tokens/s, read as a whole number (63,410), never 6.341e+4
    if (digits === 0) return Math.round(v).toLocaleString("en-US");
    return Math.abs(v) >= 1000 || Math.abs(v) < 0.001 ? v.toExponential(3) : v.toFixed(digits ?? 4);
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

function markerText(m) {
  const lines = [m.event + " at step " + fmt(m.step) + (m.attempt ? " (attempt " + m.attempt + ")" : "")];
  if (m.ts) lines.push(new Date(m.ts * 1000).toISOString());
  for (const [k, v] of Object.entries(m.detail || {})) lines.push(k + ": " + fmt(v));
  return lines.join("\n");
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
    case "job": return "job " + fmt(d.job_id) + " " + fmt(d.state) + (d.node ? " on " + d.node : "")
      + (d.exit_code !== undefined && d.exit_code !== null ? " exit " + d.exit_code : "");
    default: return m.event;
  }
}

const tip = () => document.getElementById("tip");
function showTip(text, ev) {
  const t = tip();
  t.textContent = text;
  t.hidden = false;
  t.style.left = Math.min(ev.clientX + 12, window.innerWidth - 540) + "px";
  t.style.top = (ev.clientY + 14) + "px";
}
function hideTip() { tip().hidden = true; }

// -- the runs list -------------------------------------------------------------------------

async function runsPage(main) {
  document.getElementById("title").textContent = "runs";
  const table = el("table", { id: "runs" });
  const compare = el("button", { id: "compare", onclick: () => {
    const keys = [...table.querySelectorAll("input:checked")].map((c) => c.value);
    if (keys.length) location.href = "/compare?" + keys.map((k) => "run=" + encodeURIComponent(k)).join("&");
  } }, "compare selected");
  main.replaceChildren(table, el("p", {}, compare));
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
          el("div", { className: "muted" }, r.source)),
        el("td", {}, stateBadge(r.state, r.meaning), el("div", { className: "muted" }, r.meaning)),
        el("td", {}, r.reason || ""),
        el("td", { className: "num" }, fmt(r.step) + " / " + fmt(r.total_steps)),
        el("td", { className: "num" }, fmt(r.tokens_per_s, 0)),
        el("td", { className: "num" }, duration(r.eta_s)),
        el("td", {}, best),
        el("td", { className: "num" }, duration(r.age_s) + " ago"));
    });
    table.replaceChildren(head, ...rows);
    table.dataset.loaded = String(body.length);
  }
  await draw();
  window.ilabPaintMs = performance.now();
  document.body.dataset.painted = "1";
  setInterval(() => draw().catch(() => {}), 2000);
}

// -- charts ------------------------------------------------------------------------------

// The curves each chart draws: the loss with val_loss, then one chart per other curve.
function chartGroups(names) {
  const groups = [];
  const rest = names.filter((n) => n !== "loss" && n !== "val_loss");
  if (names.includes("loss") || names.includes("val_loss"))
    groups.push(["loss", "val_loss"].filter((n) => names.includes(n)));
  const order = ["lr", "grad_norm", "tokens_per_s"];
  rest.sort((a, b) => {
    const ia = order.indexOf(a), ib = order.indexOf(b);
    const ra = a.startsWith("report:") ? 0 : 1, rb = b.startsWith("report:") ? 0 : 1;
    return (ia < 0 ? 99 : ia) - (ib < 0 ? 99 : ib) || ra - rb || (a < b ? -1 : 1);
  });
  for (const n of rest) groups.push([n]);
  return groups;
}

function drawMarkerLines(u, markers, ckState) {
  const ctx = u.ctx;
  ctx.save();
  for (const m of markers) {
    if (!LINE_KINDS.has(m.kind) || m.step === null) continue;
    const x = Math.round(u.valToPos(m.step, "x", true));
    if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
    let color = KIND_COLORS[m.kind];
    const st = m.kind === "save" ? ckState(m) : null;
    if (st === "removed") color = "#bbb";
    if (st === "best") color = "#e0a800";
    ctx.strokeStyle = color;
    ctx.lineWidth = st === "best" ? 3 : 1.5;
    ctx.setLineDash(st === "removed" ? [4, 4] : []);
    ctx.beginPath();
    ctx.moveTo(x, u.bbox.top);
    ctx.lineTo(x, u.bbox.top + u.bbox.height);
    ctx.stroke();
  }
  ctx.restore();
}

function stepRange(markers, lo, hi) {
  for (const m of markers) {
    if (m.step === null) continue;
    if (lo === null || m.step < lo) lo = m.step;
    if (hi === null || m.step > hi) hi = m.step;
  }
  return lo === hi ? [lo - 1, hi + 1] : [lo, hi];
}

function makeChart(target, names, tables, width, view) {
  const data = tables.length === 1 ? [tables[0][0], tables[0][1]] : uPlot.join(tables);
  const opts = {
    width, height: 200,
    cursor: { sync: { key: "ilab" }, drag: { x: true, y: false } },
    // the step axis spans the markers too (a train_end after the last logged step)
    scales: { x: { time: false, range: (u, lo, hi) => stepRange(view.markers, lo, hi) } },
    series: [{ label: "step" }, ...names.map((n, i) => ({
      label: n, stroke: COLORS[i % COLORS.length], spanGaps: true, width: 1.5,
      points: { show: tables[i][0].length < 60 },
    }))],
    axes: [{}, { size: 70, values: (u, splits) => splits.map((v) => fmt(v, 3)) }],
    hooks: {
      draw: [(u) => drawMarkerLines(u, view.markers, view.ckState)],
      setScale: [(u, key) => { if (key === "x") view.onZoom(u); }],
    },
  };
  const node = el("div", { className: "chart", "data-curves": names.join(",") });
  target.append(node);
  return new uPlot(opts, data, node);
}

// -- the run page --------------------------------------------------------------------------

async function runPage(main, key) {
  const cfg = await getJSON("/api/config");
  const base = "/api/runs/" + encodeURIComponent(key);
  const snap = await getJSON(base + "?width=1000");
  document.getElementById("title").textContent = key;
  const facts = el("div", { className: "facts", id: "facts" });
  const strip = el("div", { className: "strip", id: "strip" });
  const charts = el("div", { id: "charts" });
  const more = el("details", { id: "more" });
  const ckTable = el("table", { id: "checkpoints" });
  const story = el("table", { id: "story" });
  const legend = el("div", { className: "legend-keys" }, ...Object.entries(KIND_COLORS).map(([k, c]) => {
    const swatch = el("i");
    swatch.style.background = c;
    return el("span", {}, swatch, k);
  }));
  main.replaceChildren(facts);
  if (cfg.control) main.append(controlPanel(base));
  main.append(legend, strip, charts, more, el("h2", {}, "Checkpoints"), ckTable, el("h2", {}, "Story"), story);

  const view = {
    count: snap.count, series: snap.series, markers: snap.markers, checkpoints: snap.checkpoints,
    charts: [], zoom: null, syncing: false, listed: snap.listed || [], listedAll: snap.listed_all,
    pinned: [], // listed curves asked for by name: read once, not followed live
  };
  view.setCheckpoints = (rows) => {
    view.checkpoints = rows;
    // by name: a record may spell a checkpoint's path another way (relative, ./, a slash)
    view.ckMap = new Map(rows.map((r) => [r.name, r.best ? "best"
      : r.state === "removed" || r.state === "missing" ? "removed" : r.state === "leased" ? "leased" : "kept"]));
  };
  view.setCheckpoints(snap.checkpoints);
  view.ckState = (m) => view.ckMap.get(baseName((m.detail || {}).checkpoint_path)) || "kept";
  view.onZoom = (u) => {
    if (view.syncing) return;
    const { min, max } = u.scales.x;
    view.syncing = true;
    for (const c of view.charts) if (c.u !== u) c.u.setScale("x", { min, max });
    view.syncing = false;
    view.zoom = [min, max];
    placeMarkers(view, strip);
    clearTimeout(view.zoomTimer);
    view.zoomTimer = setTimeout(() => zoomDetail(view, base), 200);
  };

  const width = Math.max(400, Math.min(1200, main.clientWidth - 20));
  // Scale changes made here are not a person's zoom (view.syncing: onZoom ignores them).
  function build() {
    view.syncing = true;
    for (const c of view.charts) c.u.destroy();
    view.charts = [];
    charts.replaceChildren();
    const byName = Object.fromEntries(view.series.map((s) => [s.name, s]));
    const groups = chartGroups(view.series.map((s) => s.name));
    for (const s of view.pinned) { byName[s.name] = s; groups.push([s.name]); }
    for (const names of groups) {
      const u = makeChart(charts, names, names.map((n) => [byName[n].x, byName[n].y]), width, view);
      u.over.addEventListener("dblclick", () => { view.zoom = null; build(); });
      view.charts.push({ names, u });
    }
    view.syncing = false;
    placeMarkers(view, strip);
  }
  // names beyond the curves the server keeps: a chart of one when it is clicked
  async function pin(name) {
    const s = await getJSON(base + "/series?name=" + encodeURIComponent(name) + "&width=1000");
    view.pinned = view.pinned.filter((p) => p.name !== name).concat([s]);
    view.zoom = null;
    build();
  }
  function renderMore() {
    more.hidden = view.listed.length === 0;
    more.dataset.n = String(view.listed.length);
    more.replaceChildren(el("summary", {}, view.listed.length + (view.listedAll ? "" : "+")
      + " more metrics without a chart: click one to draw it"),
      ...view.listed.map((n) => el("button", { className: "metric", "data-name": n,
        onclick: () => pin(n).catch(() => {}) }, n)));
  }
  build();
  renderMore();
  renderFacts(facts, snap.summary);
  strip.dataset.count = String(view.markers.length);
  // the tables after the curves are on screen (a long run has thousands of rows)
  setTimeout(() => {
    renderCheckpoints(ckTable, view.checkpoints);
    renderStory(story, view.markers, true);
    document.body.dataset.tables = "1";
  }, 0);

  async function poll() {
    try {
      const n = view.series.map((s) => s.n).join(",");
      const up = await getJSON(base + "/updates?since=" + view.count + "&n=" + n + "&m=" +
        view.markers.length + "&width=1000");
      view.count = up.count;
      renderFacts(facts, up.summary);
      let rebuild = false;
      for (const s of up.series) {
        const have = view.series.find((x) => x.name === s.name);
        if (!have) { view.series.push(s); rebuild = true; continue; }
        if (s.reset) Object.assign(have, s);
        else { have.x = have.x.concat(s.x); have.y = have.y.concat(s.y); have.n = s.n; }
      }
      if (up.checkpoints) { view.setCheckpoints(up.checkpoints); renderCheckpoints(ckTable, view.checkpoints); }
      if (up.markers.length) { view.markers = view.markers.concat(up.markers); renderStory(story, up.markers, false); }
      if (up.listed) { view.listed = up.listed; view.listedAll = up.listed_all; renderMore(); }
      // a curve sent whole again (downsampled) while zoomed: the zoomed range is fetched anew
      if (view.zoom !== null && up.series.some((s) => s.reset)) zoomDetail(view, base);
      if (rebuild) build();
      else if (up.series.length || up.markers.length) {
        view.syncing = true;
        if (view.zoom === null) for (const c of view.charts) c.u.setData(chartData(view, c.names));
        else for (const c of view.charts) c.u.redraw();
        view.syncing = false;
        placeMarkers(view, strip);
      }
      strip.dataset.count = String(view.markers.length);
      document.body.dataset.count = String(view.count);
    } finally {
      setTimeout(poll, POLL_MS);
    }
  }
  document.body.dataset.count = String(view.count);
  window.ilabPaintMs = performance.now(); // since navigation start (bench_serve reads it)
  document.body.dataset.painted = "1";
  setTimeout(poll, POLL_MS);
}

// A chart's data from the curves it draws (their x joined when there are several).
function chartData(view, names) {
  const tables = names.map((n) => {
    const s = view.series.find((x) => x.name === n) || view.pinned.find((x) => x.name === n);
    return [s.x, s.y];
  });
  return tables.length === 1 ? [tables[0][0], tables[0][1]] : uPlot.join(tables);
}

async function zoomDetail(view, base) {
  const [lo, hi] = view.zoom || [null, null];
  if (lo === null) return;
  for (const c of view.charts) {
    const parts = await Promise.all(c.names.map((n) => getJSON(base + "/series?name=" +
      encodeURIComponent(n) + "&lo=" + lo + "&hi=" + hi + "&width=1000")));
    const tables = parts.map((p) => [p.x, p.y]);
    const data = tables.length === 1 ? [tables[0][0], tables[0][1]] : uPlot.join(tables);
    view.syncing = true;
    c.u.setData(data, false);
    c.u.setScale("x", { min: lo, max: hi });
    view.syncing = false;
  }
}

function placeMarkers(view, strip) {
  const first = view.charts[0];
  strip.replaceChildren();
  if (!first) return;
  const u = first.u;
  strip.style.width = u.width + "px";
  const left = u.bbox.left / devicePixelRatio;
  // Markers of one kind and state within 3 px are one mark (a long run has thousands):
  // hovering it shows how many and the last of them.
  const groups = new Map();
  for (const m of view.markers) {
    if (m.step === null) continue;
    const x = u.valToPos(m.step, "x");
    if (x < 0 || x > u.bbox.width / devicePixelRatio) continue;
    const st = m.kind === "save" ? view.ckState(m) : "";
    const key = m.kind + "/" + st + "/" + Math.round(x / 3);
    const g = groups.get(key);
    if (g) { g.n += 1; g.m = m; } else groups.set(key, { m, x, st, n: 1 });
  }
  for (const { m, x, st, n } of groups.values()) {
    const node = el("span", { className: "marker kind-" + m.kind + (st ? " ck-" + st : ""),
      "data-kind": m.kind, "data-step": m.step, "data-state": st, "data-n": n });
    node.style.left = (left + x) + "px";
    node.style.top = (2 + 11 * (STRIP_ROW[m.kind] || 0)) + "px";
    const text = (n > 1 ? n + " " + m.kind + " records here; the last:\n" : "") + markerText(m)
      + (st ? "\ncheckpoint: " + st : "");
    node.addEventListener("mouseenter", (ev) => showTip(text, ev));
    node.addEventListener("mouseleave", hideTip);
    strip.append(node);
  }
}

function renderFacts(facts, s) {
  const best = s.best ? s.best.metric + " " + fmt(s.best.value) + " at step " + fmt(s.best.step) : "–";
  facts.replaceChildren(
    el("p", {}, stateBadge(s.state, s.meaning), " ", el("span", { id: "reason" }, s.reason || ""),
      " ", el("span", { className: "muted" }, s.meaning)),
    el("p", {},
      el("span", {}, "run ", s.run_id || "–", " attempt ", fmt(s.attempt)),
      el("span", {}, "step ", el("b", { id: "step" }, fmt(s.step)), " / ", fmt(s.total_steps)),
      el("span", {}, "tokens/s ", fmt(s.tokens_per_s, 0)),
      el("span", {}, "ETA ", duration(s.eta_s)),
      el("span", {}, "best ", best),
      el("span", {}, "last record ", duration(s.age_s), " ago"),
      el("span", {}, "records ", fmt(s.records))));
  facts.dataset.state = s.state;
  facts.dataset.step = String(s.step);
}

// The last part of a path as the page names a checkpoint ("runs/b/checkpoints/step-30/").
function baseName(path) {
  return typeof path === "string" ? path.replace(/\/+$/, "").split("/").pop() : "";
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

function renderCheckpoints(table, rows) {
  const head = el("tr", {}, ...["step", "checkpoint", "on disk", "leases", "reports", "jobs", "best"]
    .map((h) => el("th", {}, h)));
  const now = Date.now() / 1000;
  // the newest rows and the best (a long run saves thousands of times; all are in /api/)
  const shown = rows.filter((r, i) => r.best || i >= rows.length - TABLE_ROWS);
  table.dataset.more = String(rows.length - shown.length);
  table.replaceChildren(head, ...shown.map((r) => el("tr", { "data-step": r.step,
    "data-on-disk": r.on_disk, "data-state": r.state, "data-best": r.best, className: "ckpt" },
    el("td", { className: "num" }, fmt(r.step)),
    el("td", {}, r.name),
    el("td", {}, ckFate(r)),
    el("td", {}, r.leases.map((l) => l.holder + " (" + duration(l.expires - now) + " left)").join("; ")),
    el("td", {}, r.reports.map((p) => Object.entries(p.metrics).map(([k, v]) => k + "=" + fmt(v)).join(" ")
      + " from " + fmt(p.source)).join("; ")),
    el("td", {}, r.jobs.map((j) => fmt(j.scheduler) + " " + fmt(j.job_id) + " " + fmt(j.state)
      + (j.node ? " on " + j.node : "") + (j.exit_code !== null ? " exit " + j.exit_code : "")).join("; ")),
    el("td", {}, r.best ? "★ best" : ""))));
}

// The story's newest lines (every eval is a point on val_loss already); the rest is in /api/.
const STORY_ROWS = 500;
const TABLE_ROWS = 500;
function renderStory(table, markers, fresh) {
  if (fresh) table.replaceChildren(el("tr", {}, el("th", {}, "step"), el("th", {}, "what")));
  const told = markers.filter((m) => m.kind !== "evaluate");
  for (const m of told.slice(-STORY_ROWS)) {
    const row = el("tr", { "data-kind": m.kind }, el("td", { className: "num" }, fmt(m.step)),
      el("td", {}, markerSummary(m)));
    row.title = markerText(m);
    table.append(row);
  }
  while (table.rows.length > STORY_ROWS + 1) table.rows[1].remove();
  table.dataset.more = String(Math.max(0, told.length - STORY_ROWS));
}

function controlPanel(base) {
  const reason = el("input", { type: "text", id: "control-reason", placeholder: "reason" });
  const said = el("span", { id: "control-said", className: "muted" });
  async function send(command) {
    const r = await fetch(base + "/control", {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-Ilab-Token": token() || "" },
      body: JSON.stringify({ command, reason: reason.value || null }),
    });
    const body = await r.json();
    said.textContent = r.ok ? command + " sent (" + body.id + "): applied at the next step"
      : "refused: " + body.error;
  }
  return el("div", { className: "control" }, reason, " ",
    ...["stop", "save", "evaluate"].map((c) => el("button", { id: "control-" + c, onclick: () => send(c) }, c)),
    " ", said);
}

// -- compare ---------------------------------------------------------------------------

async function comparePage(main) {
  const keys = new URLSearchParams(location.search).getAll("run");
  document.getElementById("title").textContent = "compare " + keys.join(", ");
  const snaps = await Promise.all(keys.map((k) => getJSON("/api/runs/" + encodeURIComponent(k) + "?width=800")));
  const names = [...new Set(snaps.flatMap((s) => s.series.map((x) => x.name)))];
  const charts = el("div", { id: "charts" });
  main.replaceChildren(charts);
  const width = Math.max(400, Math.min(1200, main.clientWidth - 20));
  const view = { markers: [], ckState: () => "", onZoom: () => {} };
  for (const name of names.sort()) {
    const have = snaps.map((s, i) => [keys[i], s.series.find((x) => x.name === name)]).filter((p) => p[1]);
    if (have.length < 2) continue;
    charts.append(el("h2", {}, name));
    const u = makeChart(charts, have.map((p) => p[0]), have.map((p) => [p[1].x, p[1].y]), width, view);
    u.root.dataset.curve = name;
  }
  document.body.dataset.painted = "1";
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
