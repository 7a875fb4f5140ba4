// ddpq's web page: polls the REST API about once a second and redraws.
// Every piece of job data goes into the page through textContent / attributes,
// never innerHTML, so a job named "<img onerror=...>" is just text.
"use strict";

const POLL_MS = 1000;
const RECENT = 50; // finished jobs shown below the live ones
const LOG_TAIL = 64 * 1024; // how much of a log to show when a job is opened
const LOG_CHUNK = 256 * 1024; // the most one poll fetches
const LOG_KEEP = 512 * 1024; // characters kept in the log pane, so a chatty job cannot bloat the tab
const TOKEN_KEY = "ddpq.token";

const $ = (id) => document.getElementById(id);

const ui = {
  states: null, // the daemon's job states and their groups, from loadStates()
  total: 0, // jobs in the database, from the last list response
  jobs: new Map(), // id -> JobOut, what the table shows now
  selected: null, // { id, offset, decoder, done } for the job whose log is open
};

// ---------------------------------------------------------------- HTTP

class HttpError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
  }
}

function token() {
  return localStorage.getItem(TOKEN_KEY) || "";
}

async function api(path) {
  const headers = {};
  if (token()) headers.Authorization = "Bearer " + token();
  const r = await fetch(path, { headers, cache: "no-store" });
  if (!r.ok) {
    let detail = r.statusText;
    try {
      detail = (await r.json()).detail || detail;
    } catch (_) {
      // not JSON (a proxy's error page): keep the status text
    }
    throw new HttpError(r.status, detail);
  }
  return r;
}

const getJson = async (path) => (await api(path)).json();

// ---------------------------------------------------------------- small helpers

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (v === null || v === undefined) continue;
    if (k === "text") node.textContent = String(v);
    else node.setAttribute(k, String(v));
  }
  for (const c of children) node.append(c);
  return node;
}

function duration(seconds) {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) return "";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return s + "s";
  const m = Math.floor(s / 60);
  if (m < 60) return m + "m" + String(s % 60).padStart(2, "0") + "s";
  const h = Math.floor(m / 60);
  if (h < 48) return h + "h" + String(m % 60).padStart(2, "0") + "m";
  return Math.floor(h / 24) + "d" + (h % 24) + "h";
}

// An argv shown the way a shell would take it back (what `ddpq show` users would type).
const shellQuote = (arg) =>
  /^[\w@%+=:,./-]+$/.test(arg) ? arg : "'" + arg.replaceAll("'", "'\"'\"'") + "'";

const secondsSince = (iso, until) => ((until ?? Date.now()) - Date.parse(iso)) / 1000;

// Training progress as a fraction of the whole run. `epoch` counts from 1 and `step` is
// within the epoch (the resnet18 workload's metrics.jsonl); other scripts may send less.
function progressFraction(p) {
  if (!p) return null;
  const { epoch, epochs, step, steps } = p;
  if (epochs > 0 && epoch > 0) {
    const within = steps > 0 && step >= 0 ? Math.min(step / steps, 1) : 1;
    return Math.min(1, Math.max(0, (epoch - 1 + within) / epochs));
  }
  if (steps > 0 && step >= 0) return Math.min(1, step / steps);
  return null;
}

function progressText(p) {
  const parts = [];
  if (p.epochs) parts.push(`epoch ${p.epoch ?? "?"}/${p.epochs}`);
  else if (p.phase) parts.push(String(p.phase));
  if (typeof p.train_loss === "number") parts.push("loss " + p.train_loss.toFixed(3));
  if (typeof p.test_acc === "number") parts.push("acc " + (100 * p.test_acc).toFixed(1) + "%");
  if (typeof p.images_per_s === "number") parts.push(Math.round(p.images_per_s) + " img/s");
  if (typeof p.eta_s === "number" && p.phase === "train") parts.push("ETA " + duration(p.eta_s));
  return parts.join(" · ");
}

function progressCell(job) {
  const p = job.progress;
  const f = progressFraction(p);
  const cell = el("td", { class: "progress-cell" });
  if (f === null && !p) return cell;
  if (f !== null) {
    const pct = Math.round(f * 100);
    cell.append(
      el("div", {
        class: "bar",
        role: "progressbar",
        "aria-valuemin": 0,
        "aria-valuemax": 100,
        "aria-valuenow": pct,
        "data-fraction": f.toFixed(4),
      }, el("div", { class: "fill", style: `width: ${pct}%` })),
    );
  }
  cell.append(el("div", { class: "progress-text", text: p ? progressText(p) : "" }));
  return cell;
}

function timeText(job) {
  if (ui.states.waiting.has(job.state)) {
    const waited = "waiting " + duration(secondsSince(job.submitted_at));
    // The daemon's forecast (predicted_start; null: unknown), as ddpq ls's START.
    if (job.state !== "queued" || !job.predicted_start) return waited;
    const left = -secondsSince(job.predicted_start);
    return waited + (left < 1 ? " · starts now" : " · starts in " + duration(left));
  }
  if (!job.started_at) return "";
  const end = job.ended_at ? Date.parse(job.ended_at) : undefined;
  return duration(secondsSince(job.started_at, end));
}

// ---------------------------------------------------------------- job states

// Which states are active, waiting or ended is the daemon's to say (ddpq.core.states), so
// the page keeps no list of its own that could drift from it.
async function loadStates() {
  const s = await getJson("/v1/meta/states");
  return {
    active: new Set(s.active),
    waiting: new Set(s.waiting),
    terminal: new Set(s.terminal),
    live: [...s.active, ...s.waiting], // listed in full, however old
  };
}

// ---------------------------------------------------------------- queue

// The API lists oldest first; on a server with a long history the first page is ancient.
// So: every live job, plus the newest RECENT jobs (by offset from the last known total).
async function loadJobs() {
  const live = await getJson(
    "/v1/jobs?limit=1000&" + ui.states.live.map((s) => "state=" + s).join("&"),
  );
  let recent = await getJson(`/v1/jobs?limit=${RECENT}&offset=${Math.max(0, ui.total - RECENT)}`);
  if (recent.total > ui.total) {
    ui.total = recent.total; // newer jobs than we asked for: ask again at the right offset
    recent = await getJson(`/v1/jobs?limit=${RECENT}&offset=${Math.max(0, ui.total - RECENT)}`);
  }
  ui.total = recent.total;
  const jobs = new Map();
  for (const j of [...recent.items, ...live.items]) jobs.set(j.id, j);
  return jobs;
}

function rank(job) {
  if (ui.states.active.has(job.state)) return 0;
  if (ui.states.waiting.has(job.state)) return 1;
  return 2;
}

function renderQueue(jobs) {
  // Running, then waiting in submission order, then the newest finished first. A sweep's
  // members are one row standing for the sweep (sweeps.js), which opens it.
  const { plain, sweeps } = foldSweeps(jobs);
  const rows = [...plain, ...sweeps].sort(
    (a, b) => rank(a) - rank(b) || (rank(a) === 2 ? b.id - a.id : a.id - b.id),
  );
  const body = el("tbody", { id: "queue-body" });
  for (const row of rows) body.append(row.sweep ? sweepQueueRow(row) : jobRow(row));
  $("queue-body").replaceWith(body);
  $("queue-empty").hidden = rows.length > 0;
  $("queue-count").textContent = ui.total ? `(${ui.total} submitted)` : "";
}

// GPU memory as people read it: "5G" where exact, else "4.1G" or "300M".
function sizeText(bytes) {
  if (bytes === null || bytes === undefined) return "";
  const g = bytes / 2 ** 30;
  if (g >= 1) return Number.isInteger(g) ? g + "G" : g.toFixed(1) + "G";
  return Math.round(bytes / 2 ** 20) + "M";
}

// What a job reserves and was measured to use (as `ddpq ls` shows it): "3.1G/5G" for one
// that shares its GPUs, its peak for one with whole GPUs, what it asks for while it waits.
function memText(job) {
  if (job.leases.gpu_mem !== null && job.leases.gpu_mem !== undefined) {
    return `${sizeText(job.peak_mem) || "-"}/${sizeText(job.leases.gpu_mem)}`;
  }
  if (job.leases.gpus.length || job.peak_mem !== null) return sizeText(job.peak_mem);
  if (job.gpu_mem_auto) return "auto";
  return sizeText(job.gpu_mem);
}

// The host's CPU cores and memory it holds (or asks for while it waits): "2 cpu · 1G ram".
function hostText(job) {
  const held = job.leases.cores || [];
  const cores = held.length || job.cpus;
  const ram = job.leases.mem ?? job.mem;
  const parts = [];
  if (cores) parts.push(`${cores} cpu`);
  if (ram !== null && ram !== undefined) parts.push(`${sizeText(ram)} ram`);
  return parts.join(" · ");
}

function jobRow(job) {
  // An elastic job's range ("2-4"), then the GPUs it holds now.
  const asked = job.gpus_max ? `${job.gpus}-${job.gpus_max}` : job.gpus;
  const leased = job.leases.gpus.length ? `${asked} [${job.leases.gpus.join(",")}]` : asked;
  const mem = memText(job);
  const host = hostText(job);
  const gpus = [leased, mem, host].filter((part) => part !== "").join(" · ");
  const tr = el(
    "tr",
    {
      "data-job-id": job.id,
      "data-state": job.state,
      tabindex: 0,
      "aria-selected": ui.selected?.id === job.id ? "true" : "false",
      title: job.reason || "",
    },
    el("td", { class: "num", text: job.id }),
    el("td", { class: "name", text: job.name }),
    el("td", { text: job.owner }),
    el("td", {}, el("span", { class: "state", "data-state": job.state, text: job.state })),
    el("td", { class: "num", text: gpus }),
    el("td", { class: "num", text: job.leases.port ?? "" }),
    progressCell(job),
    el("td", { class: "num", text: timeText(job) }),
  );
  tr.addEventListener("click", () => openLog(job.id));
  tr.addEventListener("keydown", (e) => {
    if (e.key === "Enter") openLog(job.id);
  });
  return tr;
}

// ---------------------------------------------------------------- GPUs

function renderGpus(devices) {
  const portOf = new Map(); // job id -> rendezvous port
  for (const [port, jobId] of Object.entries(devices.ports_leased)) portOf.set(jobId, port);
  const grid = el("div", { id: "gpus", class: "gpu-grid" });
  for (const d of devices.items) {
    const lines = [el("div", { class: "gpu-head", text: `GPU ${d.index}` })];
    const fake = d.fake && !/fake/i.test(d.name) ? " (fake)" : "";
    // A MIG instance is a GPU of its own: its profile and the GPU it is carved from.
    const mig = d.mig_profile ? ` MIG ${d.mig_profile} (on GPU ${d.parent})` : "";
    lines.push(el("div", { class: "gpu-name muted", text: d.name + mig + fake }));
    if (d.numa !== null && d.numa !== undefined) {
      lines.push(el("div", { class: "muted", text: `NUMA ${d.numa}` }));
    }
    lines.push(el("div", { class: "gpu-status", text: d.status }));
    if (d.job_id !== null) {
      lines.push(el("div", { text: `job ${d.job_id} · ${d.owner ?? "?"}` }));
      if (portOf.has(d.job_id)) lines.push(el("div", { text: "port " + portOf.get(d.job_id) }));
      if (d.idle_since) {
        // Its job has left its GPUs unused this long (long: past the daemon's --idle).
        const idle = (Date.now() - Date.parse(d.idle_since)) / 1000;
        lines.push(el("div", {
          class: d.idle_long ? "gpu-idle long" : "gpu-idle",
          text: "idle " + duration(Math.max(0, idle)),
        }));
      }
    } else if (d.shares && d.shares.length) {
      for (const s of d.shares) {
        const share = el("div", {
          class: "gpu-share",
          "data-job-id": s.job_id,
          text: `job ${s.job_id} · ${s.owner ?? "?"} · ${sizeText(s.gpu_mem)}`,
        });
        share.addEventListener("click", () => openLog(s.job_id));
        lines.push(share);
      }
    }
    if (d.status === "external" || (d.shares?.length && d.external_processes.length)) {
      const who = outsideText(d.external_processes) || "?";
      lines.push(el("div", { class: "gpu-outside", text: "not ddpq: " + who }));
    }
    if (d.memory_total_mb > 0) {
      const reserved = (d.shares || []).reduce((sum, s) => sum + s.gpu_mem, 0);
      lines.push(el("div", {
        class: "muted",
        text: `${(d.memory_used_mb / 1024).toFixed(1)} / ${(d.memory_total_mb / 1024).toFixed(0)} GiB` +
          (reserved ? ` · ${sizeText(reserved)} reserved` : ""),
      }));
    }
    const card = el("div", {
      class: "gpu",
      "data-gpu-index": d.index,
      "data-status": d.status,
      "data-job-id": d.job_id ?? "",
    }, ...lines);
    if (d.job_id !== null) card.addEventListener("click", () => openLog(d.job_id));
    grid.append(card);
  }
  $("gpus").replaceWith(grid);
  // What holds jobs to their cores, memory and processes; a kind nothing enforces says so.
  const limits = (devices.limits || []).map((x) =>
    el("span", { class: x.enforced ? "limit" : "limit off", text: x.said }));
  $("limits").replaceWith(el("div", { id: "limits", class: "limits muted" }, ...limits));
  const free = devices.items.filter((d) => d.status === "free").length;
  return { gpus: devices.items.length, free };
}

// Whose the processes in no job are: "bob (robert) pid 12, 13; uid 1234 pid 9".
function outsideText(procs) {
  const byPerson = new Map();
  for (const p of procs) {
    const uid = p.uid !== null && p.uid !== undefined ? `uid ${p.uid}` : "unknown";
    const account = p.account || uid;
    const who = p.user && p.user !== p.account ? `${p.user} (${account})` : account;
    if (!byPerson.has(who)) byPerson.set(who, []);
    byPerson.get(who).push(p.pid);
  }
  return [...byPerson].map(([who, pids]) => `${who} pid ${pids.join(", ")}`).join("; ");
}

// ---------------------------------------------------------------- log

function openLog(jobId) {
  if (ui.selected?.id === jobId) return;
  ui.selected = { id: jobId, offset: null, decoder: new TextDecoder(), done: false };
  $("log").textContent = "";
  $("log-section").hidden = false;
  describeSelected();
  for (const tr of document.querySelectorAll("#queue-body tr")) {
    tr.setAttribute("aria-selected", String(Number(tr.dataset.jobId) === jobId));
  }
  showInAddress(`#job-${jobId}`);
  pollLog().catch(showError);
}

function closeLog() {
  if (ui.selected) leaveAddress(`#job-${ui.selected.id}`);
  ui.selected = null;
  $("log-section").hidden = true;
  for (const tr of document.querySelectorAll("#queue-body tr[aria-selected=true]")) {
    tr.setAttribute("aria-selected", "false");
  }
}

function describeSelected() {
  const sel = ui.selected;
  if (!sel) return;
  const job = ui.jobs.get(sel.id);
  $("log-title").textContent = job ? `Job ${job.id} · ${job.name}` : `Job ${sel.id}`;
  const state = $("log-state");
  state.textContent = job ? job.state : "";
  state.dataset.state = job ? job.state : "";
  const meta = [];
  if (job) {
    meta.push(job.command.map(shellQuote).join(" "));
    if (job.exit_code !== null) meta.push("exit " + job.exit_code);
    if (job.exit_signal !== null) meta.push("signal " + job.exit_signal);
    if (job.reason) meta.push(job.reason);
  }
  $("log-meta").textContent = meta.join(" — ");
  // A sweep's member links its sweep, as the address links this log.
  const link = $("log-sweep");
  link.hidden = !(job && job.sweep_id !== null && job.sweep_id !== undefined);
  if (!link.hidden) {
    link.href = `#sweep-${job.sweep_id}`;
    link.textContent = `sweep s${job.sweep_id}`;
  }
}

// ---------------------------------------------------------------- links
// The address says what is open: #job-12 (its log) or #sweep-3, to bookmark or send;
// opening such an address opens it.

const LINK = /^#(job|sweep)-(\d{1,15})$/;

function showInAddress(hash) {
  if (location.hash !== hash) history.replaceState(null, "", hash);
}

function leaveAddress(hash) {
  if (location.hash === hash) history.replaceState(null, "", location.pathname + location.search);
}

function followAddress() {
  const found = LINK.exec(location.hash);
  if (!found) return;
  const id = Number(found[2]);
  if (found[1] === "job") openLog(id);
  else openSweep(id);
}

function appendLog(text) {
  const pre = $("log");
  // Follow the end only if the reader is already there, so scrolling back is not undone.
  const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  let all = pre.textContent + text;
  if (all.length > LOG_KEEP) all = all.slice(all.length - LOG_KEEP);
  pre.textContent = all;
  if (atEnd) pre.scrollTop = pre.scrollHeight;
}

async function pollLog() {
  const sel = ui.selected;
  if (!sel || sel.done || sel.busy) return;
  sel.busy = true;
  try {
    const url = (offset, limit) => `/v1/jobs/${sel.id}/log?offset=${offset}&limit=${limit}`;
    if (sel.offset === null) {
      // Opening a job: start at its last LOG_TAIL bytes, not at the top of a long log.
      const head = await api(url(0, 1));
      sel.offset = Math.max(0, Number(head.headers.get("X-Ddpq-Log-Size") || 0) - LOG_TAIL);
    }
    const r = await api(url(sel.offset, LOG_CHUNK));
    if (ui.selected !== sel) return; // another job was opened meanwhile
    const size = Number(r.headers.get("X-Ddpq-Log-Size") || 0);
    const data = new Uint8Array(await r.arrayBuffer());
    if (size < sel.offset) {
      // The shim compacted the log past its cap: start again near the new end.
      appendLog("\n[log compacted; some output skipped]\n");
      sel.offset = Math.max(0, size - LOG_TAIL);
      sel.decoder = new TextDecoder();
      return;
    }
    sel.offset = Number(r.headers.get("X-Ddpq-Next-Offset") || sel.offset + data.length);
    // stream: a multi-byte character split across two polls decodes whole.
    if (data.length) appendLog(sel.decoder.decode(data, { stream: true }));
    const ended = ui.states.terminal.has(r.headers.get("X-Ddpq-Job-State"));
    if (ended && sel.offset >= size) sel.done = true; // nothing more will come
  } catch (e) {
    if (e instanceof HttpError && (e.status === 403 || e.status === 404)) {
      $("log").textContent = e.message;
      sel.done = true;
      return;
    }
    throw e;
  } finally {
    sel.busy = false;
  }
}

// ---------------------------------------------------------------- token

async function showWhoami() {
  try {
    const me = await getJson("/v1/whoami");
    $("whoami").textContent = me.auth ? `signed in as ${me.name}` : "";
    // Without --auth the token box is only clutter; keep it if a token is stored anyway.
    $("token-form").dataset.auth = me.auth || token() ? "on" : "off";
  } catch (e) {
    $("whoami").textContent = "";
    $("token-form").dataset.auth = "on";
  }
}

function setupToken() {
  $("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const value = $("token-input").value.trim();
    if (value) localStorage.setItem(TOKEN_KEY, value);
    $("token-input").value = "";
    refreshNow();
  });
  $("token-forget").addEventListener("click", () => {
    localStorage.removeItem(TOKEN_KEY);
    refreshNow();
  });
  $("token-input").placeholder = token() ? "token saved (paste to replace)" : $("token-input").placeholder;
}

function refreshNow() {
  showWhoami();
  if (ui.selected) ui.selected.done = false;
  tick();
}

// ---------------------------------------------------------------- main loop

function showError(e) {
  const banner = $("banner");
  if (e instanceof HttpError && e.status === 401) {
    banner.textContent = token()
      ? "The daemon rejected this token (" + e.message + "). Paste a valid one above."
      : "This daemon needs a token: paste yours above (ddpq token, or your DDPQ_TOKEN).";
    $("token-form").dataset.auth = "on";
  } else if (e instanceof HttpError) {
    banner.textContent = `Error ${e.status}: ${e.message}`;
  } else {
    banner.textContent = "Cannot reach the ddpq daemon; retrying… (" + e.message + ")";
  }
  banner.hidden = false;
}

let timer = null;

async function tick() {
  clearTimeout(timer);
  try {
    // A hidden tab does not poll; it catches up at once when shown again.
    if (!document.hidden) {
      if (!ui.states) ui.states = await loadStates(); // again at each tick until it answers
      const [jobs, devices] = await Promise.all([
        loadJobs(),
        getJson("/v1/devices"),
        loadSweeps(),
        loadReservations(),
      ]);
      ui.jobs = jobs;
      renderQueue(jobs);
      renderSweeps();
      renderReservations();
      await pollSweep();
      const g = renderGpus(devices);
      const running = [...jobs.values()].filter((j) => j.state === "running").length;
      const queued = [...jobs.values()].filter((j) => j.state === "queued").length;
      $("summary").textContent =
        `${running} running · ${queued} queued · ${g.free}/${g.gpus} GPUs free`;
      describeSelected();
      await pollLog();
      $("banner").hidden = true;
      $("updated").textContent = new Date().toLocaleTimeString();
    }
  } catch (e) {
    showError(e);
  } finally {
    timer = setTimeout(tick, POLL_MS);
  }
}

document.addEventListener("visibilitychange", () => {
  if (!document.hidden) tick();
});

window.addEventListener("DOMContentLoaded", () => {
  setupToken();
  setupSweeps();
  $("log-close").addEventListener("click", closeLog);
  window.addEventListener("hashchange", followAddress);
  followAddress();
  showWhoami();
  tick();
});
