// ddpq's web page, sweeps: the list, a sweep's members folded into one queue row, and one
// sweep opened as a table of its members and a plot of every member's metric per epoch.
// The plot is inline SVG drawn here (no library: nothing is fetched from anywhere else),
// from each member's metrics history (GET /v1/jobs/{id}/metrics, read from an offset so a
// poll fetches only new lines). As in app.js, job data reaches the page only as text and
// attributes, never as markup.
"use strict";

const SWEEPS_SHOWN = 20; // the newest sweeps listed
const SERIES_KEEP = 5000; // records kept per member, so a chatty job cannot bloat the tab
const METRICS_PARALLEL = 6; // member histories fetched at once
const METRICS_ROUNDS = 4; // reads per member per poll, to catch up a long file
const SVG_NS = "http://www.w3.org/2000/svg";
const PLOT = { w: 720, h: 300, left: 56, right: 12, top: 12, bottom: 34 };
// Fields that say where a record is, not what was measured: the x axis, not a metric.
const POSITION_FIELDS = new Set(["epoch", "epochs", "step", "steps", "time"]);

const sw = {
  total: 0, // sweeps in the database, from the last list response
  list: new Map(), // id -> SweepOut, the newest SWEEPS_SHOWN
  open: null, // the sweep shown: { id, detail, sort, metric, series: Map(jobId -> history) }
};

// ---------------------------------------------------------------- the list

async function loadSweeps() {
  const page = (offset) => getJson(`/v1/sweeps?limit=${SWEEPS_SHOWN}&offset=${offset}`);
  let got = await page(Math.max(0, sw.total - SWEEPS_SHOWN));
  if (got.total > sw.total) {
    sw.total = got.total; // newer sweeps than we asked for: ask again at the right offset
    got = await page(Math.max(0, sw.total - SWEEPS_SHOWN));
  }
  sw.total = got.total;
  sw.list = new Map(got.items.map((s) => [s.id, s]));
}

// "2 running · 3 queued", in the daemon's order of states.
function countsText(counts) {
  const order = ui.states ? [...ui.states.active, ...ui.states.waiting, ...ui.states.terminal] : [];
  const names = [...order, ...Object.keys(counts).filter((s) => !order.includes(s))];
  return names.filter((s) => counts[s]).map((s) => `${counts[s]} ${s}`).join(" · ");
}

// One state that stands for a whole sweep: what it is doing now, else how it ended.
function summaryState(counts) {
  const has = (s) => (counts[s] || 0) > 0;
  if (has("running") || has("starting")) return "running";
  if (has("queued")) return "queued";
  if (has("held")) return "held";
  for (const s of ["failed", "timed_out", "cancelled"]) if (has(s)) return s;
  return "succeeded";
}

function renderSweeps() {
  const body = el("tbody", { id: "sweeps-body" });
  for (const s of [...sw.list.values()].reverse()) {
    const tr = el(
      "tr",
      {
        "data-sweep-id": s.id,
        "data-state": summaryState(s.counts),
        tabindex: 0,
        "aria-selected": sw.open?.id === s.id ? "true" : "false",
      },
      el("td", { class: "num", text: s.id }),
      el("td", { class: "name", text: s.name }),
      el("td", { text: s.owner }),
      el("td", { class: "num", text: s.size }),
      el("td", { class: "num", text: s.max_running ?? "" }),
      el("td", { class: "progress-text", text: countsText(s.counts) }),
    );
    tr.addEventListener("click", () => openSweep(s.id));
    tr.addEventListener("keydown", (e) => {
      if (e.key === "Enter") openSweep(s.id);
    });
    body.append(tr);
  }
  $("sweeps-body").replaceWith(body);
  $("sweeps-section").hidden = sw.list.size === 0;
  $("sweeps-count").textContent = sw.total ? `(${sw.total})` : "";
}

// ---------------------------------------------------------------- the queue, folded

// The queue's jobs with each sweep's members replaced by one row standing for the sweep:
// { plain: [JobOut], sweeps: [row] }, each row sorted as a job would be (by its first
// member's id and its summary state).
function foldSweeps(jobs) {
  const plain = [];
  const groups = new Map();
  for (const job of jobs.values()) {
    if (job.sweep_id === null || job.sweep_id === undefined) {
      plain.push(job);
      continue;
    }
    if (!groups.has(job.sweep_id)) groups.set(job.sweep_id, []);
    groups.get(job.sweep_id).push(job);
  }
  const sweeps = [];
  for (const [sweepId, members] of groups) {
    const known = sw.list.get(sweepId);
    const counts = known ? known.counts : {};
    if (!known) for (const m of members) counts[m.state] = (counts[m.state] || 0) + 1;
    sweeps.push({
      sweep: true,
      sweepId,
      id: Math.min(...members.map((m) => m.id)),
      name: known ? known.name : members[0].name,
      owner: members[0].owner,
      state: summaryState(counts),
      counts,
      gpus: members.flatMap((m) => m.leases.gpus).sort((a, b) => a - b),
      members: known ? known.size : members.length,
    });
  }
  return { plain, sweeps };
}

function sweepQueueRow(row) {
  const tr = el(
    "tr",
    {
      "data-sweep-id": row.sweepId,
      "data-state": row.state,
      class: "sweep-row",
      tabindex: 0,
      title: `sweep ${row.sweepId}: ${row.members} members`,
    },
    el("td", { class: "num", text: "sweep " + row.sweepId }),
    el("td", { class: "name", text: `${row.name} (${row.members})` }),
    el("td", { text: row.owner }),
    el("td", {}, el("span", { class: "state", "data-state": row.state, text: row.state })),
    el("td", { class: "num", text: row.gpus.length ? `${row.gpus.length} [${row.gpus.join(",")}]` : "" }),
    el("td", { class: "num", text: "" }),
    el("td", { class: "progress-cell" }, el("div", { class: "progress-text", text: countsText(row.counts) })),
    el("td", { class: "num", text: "" }),
  );
  tr.addEventListener("click", () => openSweep(row.sweepId));
  tr.addEventListener("keydown", (e) => {
    if (e.key === "Enter") openSweep(row.sweepId);
  });
  return tr;
}

// ---------------------------------------------------------------- one sweep

function openSweep(sweepId) {
  if (sw.open?.id === sweepId) return;
  sw.open = { id: sweepId, detail: null, sort: null, metric: null, series: new Map() };
  $("sweep-section").hidden = false;
  $("sweep-title").textContent = `Sweep ${sweepId}`;
  $("sweep-meta").textContent = "";
  $("sweep-body").replaceChildren();
  $("sweep-plot").replaceChildren();
  $("sweep-metric").replaceChildren();
  for (const tr of document.querySelectorAll("#sweeps-body tr")) {
    tr.setAttribute("aria-selected", String(Number(tr.dataset.sweepId) === sweepId));
  }
  showInAddress(`#sweep-${sweepId}`);
  pollSweep().catch(showError);
}

function closeSweep() {
  if (sw.open) leaveAddress(`#sweep-${sw.open.id}`);
  sw.open = null;
  $("sweep-section").hidden = true;
}

async function pollSweep() {
  const o = sw.open;
  if (!o || o.busy) return;
  o.busy = true;
  try {
    const query = o.sort ? "?sort=" + encodeURIComponent(o.sort) : "";
    const detail = await getJson(`/v1/sweeps/${o.id}${query}`);
    if (sw.open !== o) return; // another sweep was opened meanwhile
    o.detail = detail;
    await pollSeries(o);
    if (sw.open === o) renderSweep(o);
  } catch (e) {
    if (e instanceof HttpError && (e.status === 403 || e.status === 404)) {
      $("sweep-meta").textContent = e.message;
      return;
    }
    throw e;
  } finally {
    o.busy = false;
  }
}

// Fetch what is new in the history of every member that has started and may have more.
async function pollSeries(o) {
  const todo = o.detail.members.filter((m) => m.started_at && !o.series.get(m.id)?.done);
  let next = 0;
  const worker = async () => {
    while (next < todo.length && sw.open === o) await pollMember(todo[next++], o);
  };
  await Promise.all(Array.from({ length: Math.min(METRICS_PARALLEL, todo.length) }, worker));
}

async function pollMember(member, o) {
  let h = o.series.get(member.id);
  if (!h) {
    h = { offset: 0, records: [], done: false };
    o.series.set(member.id, h);
  }
  for (let round = 0; round < METRICS_ROUNDS; round++) {
    const r = await getJson(`/v1/jobs/${member.id}/metrics?offset=${h.offset}`);
    if (r.size < h.offset) {
      h.offset = 0; // the file was replaced: read it again from its start
      h.records = [];
      continue;
    }
    h.records.push(...r.records);
    if (h.records.length > SERIES_KEEP) h.records.splice(0, h.records.length - SERIES_KEEP);
    const moved = r.next_offset > h.offset;
    h.offset = r.next_offset;
    if (ui.states.terminal.has(r.state) && (!moved || h.offset >= r.size)) h.done = true;
    if (h.done || !moved || h.offset >= r.size) return;
  }
}

// Where a record sits on the x axis: its epoch (with the step's share of a training
// epoch when it has one), else its place among the member's records.
function xOf(rec, i) {
  if (typeof rec.epoch !== "number") return i + 1;
  if (typeof rec.step === "number" && typeof rec.steps === "number" && rec.steps > 0) {
    return rec.epoch - 1 + Math.min(1, Math.max(0, rec.step / rec.steps));
  }
  return rec.epoch;
}

function metricChoices(o) {
  const names = new Set();
  for (const h of o.series.values()) for (const r of h.records) for (const k in r) names.add(k);
  for (const m of o.detail.members) {
    for (const [k, v] of Object.entries(m.metrics || {})) if (typeof v === "number") names.add(k);
  }
  const metrics = [...names].filter((k) => !POSITION_FIELDS.has(k)).sort();
  // The usual question first: how accurate is each member?
  return metrics.includes("test_acc") ? ["test_acc", ...metrics.filter((k) => k !== "test_acc")] : metrics;
}

function renderMetricSelect(o) {
  const choices = metricChoices(o);
  if (!o.metric || !choices.includes(o.metric)) o.metric = choices[0] || null;
  const select = $("sweep-metric");
  const shown = [...select.options].map((x) => x.value).join("\n");
  if (shown !== choices.join("\n")) {
    select.replaceChildren(...choices.map((c) => el("option", { value: c, text: c })));
  }
  if (o.metric) select.value = o.metric;
}

const colour = (index) => `hsl(${Math.round((index * 137.508) % 360)} 65% 45%)`;

function paramsText(params) {
  return Object.entries(params).map(([k, v]) => `${k}=${v}`).join(" ");
}

function renderSweep(o) {
  const d = o.detail;
  $("sweep-title").textContent = `Sweep ${d.id} · ${d.name}`;
  const cap = d.max_running ? ` · at most ${d.max_running} at once` : "";
  $("sweep-meta").textContent =
    `${d.owner} · ${d.size} members${cap} · ${countsText(d.counts)} — ` +
    d.command.map(shellQuote).join(" ");
  renderMetricSelect(o);
  const metric = o.metric;
  const arrow = o.sort === "-" + metric ? " ▼" : o.sort === metric ? " ▲" : "";
  $("sweep-sort").textContent = (metric || "metric") + arrow;
  const body = el("tbody", { id: "sweep-body" });
  for (const m of d.members) {
    const h = o.series.get(m.id);
    const last = m.metrics && typeof m.metrics[metric] === "number" ? m.metrics[metric] : lastValue(h, metric);
    const tr = el(
      "tr",
      { "data-job-id": m.id, "data-state": m.state, tabindex: 0, title: m.reason || "" },
      el("td", {}, el("span", { class: "swatch", style: `background: ${colour(m.index)}` })),
      el("td", { class: "num", text: m.index }),
      el("td", { class: "name", text: `${m.id} ${m.name}` }),
      el("td", { class: "params", text: paramsText(m.params) }),
      el("td", {}, el("span", { class: "state", "data-state": m.state, text: m.state })),
      el("td", { class: "num metric", text: last === null ? "" : formatValue(last) }),
      el("td", { class: "num", text: m.metrics?.epoch ?? "" }),
    );
    tr.addEventListener("click", () => openLog(m.id));
    body.append(tr);
  }
  $("sweep-body").replaceWith(body);
  renderPlot(o);
}

function lastValue(history, metric) {
  if (!history) return null;
  for (let i = history.records.length - 1; i >= 0; i--) {
    const v = history.records[i][metric];
    if (typeof v === "number") return v;
  }
  return null;
}

function formatValue(v) {
  if (Number.isInteger(v)) return String(v);
  return Math.abs(v) >= 1000 || Math.abs(v) < 0.001 ? v.toExponential(3) : v.toFixed(4);
}

// ---------------------------------------------------------------- the plot

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  for (const c of children) node.append(c);
  return node;
}

// About `count` ticks at round numbers (1, 2 or 5 times a power of ten: 0.1/0.2/0.3, 4/6/8),
// and the axis widened to the ticks around [lo, hi]; `digits`: the decimals they need.
// A job writes its metrics: a range of 1e-120 or of 1e308 must draw something, never
// throw (toFixed takes at most 100 digits) and stop the page's refresh.
function niceTicks(lo, hi, count) {
  const MAX_DIGITS = 20; // beyond this a tick is written with an exponent (tickText)
  const rough = (hi - lo) / count;
  const power = 10 ** Math.floor(Math.log10(rough));
  const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= rough);
  const first = Math.floor(lo / step + 1e-9);
  const last = Math.ceil(hi / step - 1e-9);
  // No step (an empty or infinite range: NaN or Infinity here), or one that no longer
  // moves the count past 2^53 (1e17 and 1e17 + 16): the ends alone.
  const counted = Number.isSafeInteger(first) && Number.isSafeInteger(last);
  if (!Number.isFinite(step) || !counted || last - first > 1000) {
    return { lo, hi, ticks: [lo, hi], digits: 0 };
  }
  const digits = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
  const ticks = [];
  for (let i = first; i <= last; i++) {
    ticks.push(digits <= MAX_DIGITS ? Number((i * step).toFixed(digits)) : i * step);
  }
  return { lo: ticks[0], hi: ticks[ticks.length - 1], ticks, digits: Math.min(digits, MAX_DIGITS) };
}
// The least and the most of `values`, in one pass: a spread (Math.min(...values)) of
// hundreds of thousands of points overflows the stack.
function extent(values) {
  let [lo, hi] = [Infinity, -Infinity];
  for (const v of values) {
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  return [lo, hi];
}

function tickText(v, digits) {
  return Math.abs(v) >= 1e6 || (v !== 0 && Math.abs(v) < 1e-4) ? v.toExponential(1) : v.toFixed(digits);
}

function renderPlot(o) {
  const plot = $("sweep-plot");
  const metric = o.metric;
  const lines = [];
  for (const m of o.detail.members) {
    const h = o.series.get(m.id);
    if (!h || !metric) continue;
    const points = [];
    h.records.forEach((r, i) => {
      if (typeof r[metric] === "number") points.push([xOf(r, i), r[metric]]);
    });
    if (points.length) lines.push({ member: m, points });
  }
  const all = lines.flatMap((l) => l.points);
  if (!all.length) {
    plot.replaceChildren(
      svg("text", { x: PLOT.w / 2, y: PLOT.h / 2, "text-anchor": "middle", class: "plot-note" },
        metric ? `no ${metric} yet` : "no metrics yet"),
    );
    plot.dataset.lines = "0";
    return;
  }
  let [x0, x1] = extent(all.map((p) => p[0]));
  let [y0, y1] = extent(all.map((p) => p[1]));
  if (x0 === x1) [x0, x1] = [x0 - 1, x1 + 1];
  if (y0 === y1) [y0, y1] = [y0 - Math.abs(y0 || 1) * 0.05, y1 + Math.abs(y1 || 1) * 0.05];
  const yAxis = niceTicks(y0, y1, 4);
  const xAxis = niceTicks(x0, x1, 5);
  [y0, y1, x0, x1] = [yAxis.lo, yAxis.hi, xAxis.lo, xAxis.hi];
  const sx = (x) => PLOT.left + ((x - x0) / (x1 - x0)) * (PLOT.w - PLOT.left - PLOT.right);
  const sy = (y) => PLOT.h - PLOT.bottom - ((y - y0) / (y1 - y0)) * (PLOT.h - PLOT.top - PLOT.bottom);
  const nodes = [
    svg("line", { x1: PLOT.left, y1: PLOT.h - PLOT.bottom, x2: PLOT.w - PLOT.right, y2: PLOT.h - PLOT.bottom, class: "axis" }),
    svg("line", { x1: PLOT.left, y1: PLOT.top, x2: PLOT.left, y2: PLOT.h - PLOT.bottom, class: "axis" }),
  ];
  for (const y of yAxis.ticks) {
    nodes.push(svg("line", { x1: PLOT.left, x2: PLOT.w - PLOT.right, y1: sy(y), y2: sy(y), class: "grid" }));
    nodes.push(svg("text", { x: PLOT.left - 6, y: sy(y) + 4, "text-anchor": "end", class: "tick" },
      tickText(y, yAxis.digits)));
  }
  for (const x of xAxis.ticks) {
    nodes.push(svg("text", { x: sx(x), y: PLOT.h - PLOT.bottom + 16, "text-anchor": "middle", class: "tick" },
      tickText(x, xAxis.digits)));
  }
  const xLabel = all.length && o.series.size && hasEpochs(o) ? "epoch" : "record";
  nodes.push(svg("text", { x: PLOT.w - PLOT.right, y: PLOT.h - 4, "text-anchor": "end", class: "tick" }, xLabel));
  for (const { member, points } of lines) {
    const d = points.map(([x, y], i) => `${i ? "L" : "M"}${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(" ");
    const last = points[points.length - 1][1];
    nodes.push(
      svg(
        "path",
        {
          d: points.length === 1 ? d + " l0,0" : d, // one point: a dot (round caps)
          class: "series",
          stroke: colour(member.index),
          "data-job-id": member.id,
          "data-index": member.index,
          "data-points": points.length,
        },
        svg("title", {}, `${member.name} (${paramsText(member.params)}): ${metric} ${formatValue(last)}`),
      ),
    );
  }
  plot.replaceChildren(...nodes);
  plot.dataset.lines = String(lines.length);
}

function hasEpochs(o) {
  for (const h of o.series.values()) if (h.records.some((r) => typeof r.epoch === "number")) return true;
  return false;
}

// ---------------------------------------------------------------- wiring

function setupSweeps() {
  $("sweep-close").addEventListener("click", closeSweep);
  $("sweep-metric").addEventListener("change", (e) => {
    const o = sw.open;
    if (!o) return;
    const was = o.metric;
    o.metric = e.target.value;
    if (o.sort) o.sort = o.sort.startsWith("-") ? "-" + o.metric : o.metric; // same direction
    if (o.sort && was !== o.metric) pollSweep().catch(showError);
    else if (o.detail) renderSweep(o);
  });
  const cycleSort = () => {
    const o = sw.open;
    if (!o || !o.metric) return;
    // Highest first, then lowest first, then the sweep's own order.
    o.sort = o.sort === "-" + o.metric ? o.metric : o.sort === o.metric ? null : "-" + o.metric;
    pollSweep().catch(showError);
  };
  $("sweep-sort").addEventListener("click", cycleSort);
  $("sweep-sort").addEventListener("keydown", (e) => {
    if (e.key === "Enter") cycleSort();
  });
}
