// The cluster page: draws each state the server pushes on /api/stream.
// Plain DOM code: every text from the cluster goes in through textContent, never as HTML.
"use strict";

const LABELS = ["READY", "BUSY", "SUSPECT", "PREEMPTING", "MAINTENANCE", "BROKEN"];
const SHORT = {
  READY: "ready", BUSY: "busy", SUSPECT: "suspect", PREEMPTING: "preempt",
  MAINTENANCE: "maint", BROKEN: "broken",
};
const FILTERS = ["slice", "tenant"]; // the page's query parameters, preset the timeline filters

const charts = new Map(); // run id -> {node, chart}: reused while the run stays listed
const eventSlices = new WeakMap(); // timeline row -> its event's slices
let readAt = null; // read_at of the last connected state
let streamed = false; // the stream has delivered a state (the first /api/state is then stale)

// --- helpers -----------------------------------------------------------------------------

function td(text, cls) {
  return el("td", { class: cls }, text === null || text === undefined ? "" : text);
}

function duration(s) {
  if (s === null || s === undefined || !isFinite(s)) return "";
  if (s < 60) return `${s.toFixed(1)} s`;
  const [big, small, units] = s < 3600
    ? [Math.floor(s / 60), Math.floor(s % 60), ["min", "s"]]
    : [Math.floor(s / 3600), Math.floor((s % 3600) / 60), ["h", "min"]];
  return small ? `${big} ${units[0]} ${small} ${units[1]}` : `${big} ${units[0]}`;
}

function clock(at) {
  const d = new Date(at * 1000);
  return [d.getHours(), d.getMinutes(), d.getSeconds()]
    .map((n) => String(n).padStart(2, "0"))
    .join(":");
}

// --- header ------------------------------------------------------------------------------

function drawCounts(counts) {
  const labels = LABELS.filter((l) => counts[l]);
  labels.push(...Object.keys(counts).filter((l) => !LABELS.includes(l)).sort());
  $("counts").replaceChildren(
    ...labels.map((l) => el("span", { class: "count", "data-state": l }, `${counts[l]} ${l}`))
  );
}

/** The banner: connected (error undefined) or "disconnected, retrying" with why. */
function showConnection(error) {
  const banner = $("connection");
  if (error === undefined) {
    banner.dataset.state = "connected";
    const age = Math.max(0, Date.now() / 1000 - readAt);
    banner.replaceChildren(`connected · read ${age.toFixed(1)} s ago`);
  } else {
    banner.dataset.state = "disconnected";
    banner.replaceChildren("disconnected, retrying", error ? el("small", {}, error) : null);
  }
}

// --- slices ------------------------------------------------------------------------------

function hostCell(sliceName, host, subslice) {
  const attrs = {
    class: subslice ? "host in-subslice" : "host", "data-slice": sliceName,
    "data-worker": host.worker_id, "data-state": host.label, "data-node": host.node || null,
    "data-subslice": subslice || null, title: host.reason || null,
  };
  const short = SHORT[host.label] || String(host.label).toLowerCase();
  return el("div", attrs, el("span", { class: "worker" }, host.worker_id), short);
}

function sliceCard(s) {
  const inSubslice = new Map(); // worker id -> "2x4 #0"
  const subslices = s.subslices || [];
  for (const sub of subslices) {
    for (const w of sub.workers) inSubslice.set(w, `${sub.topology} #${sub.index}`);
  }
  const rows = (s.grid || []).map((row) => el("div", { class: "grid-row" },
    ...row.map((h) => hostCell(s.name, h, inSubslice.get(h.worker_id)))));
  const h = s.holder;
  const holder = h
    ? `held by ${[h.tenant, h.who, h.job && `Ray job ${h.job}`, duration(h.held_s)].filter(Boolean).join(" · ")}`
    : "free";
  const used = subslices.map((sub) =>
    el("li", {}, `${sub.topology} #${sub.index} in use: hosts ${sub.workers.join(",")}`));
  return el("section", { class: "slice", "data-slice": s.name, "data-state": s.label },
    el("div", { class: "title" },
      el("span", { class: "name" }, s.name),
      el("span", { class: "muted" }, s.shape),
      el("span", { class: "label", "data-state": s.label }, s.label)),
    s.reason ? el("p", { class: "reason" }, s.reason) : null,
    el("p", {}, `hosts up ${s.hosts_text} · TPU chips free ${s.tpu_text}`),
    el("p", { class: "holder" }, holder),
    el("div", { class: "grid" }, ...rows),
    used.length ? el("ul", { class: "subslices" }, ...used) : null);
}

function drawSlices(slices) {
  $("slices").replaceChildren(
    ...(slices.length ? slices.map(sliceCard) : [el("p", { class: "empty" }, "no TPU slices")])
  );
}

// --- queue and teams ---------------------------------------------------------------------

function drawQueue(queue) {
  if (!queue.length) {
    $("queue-box").replaceChildren(el("p", { class: "empty" }, "no one is waiting"));
    return;
  }
  const rows = queue.map((r) => el("tr", { class: "request", "data-tenant": r.tenant },
    td(r.position, "num"), td(r.tenant), td(r.wants),
    td(r.preemptible ? `${r.priority} (preemptible)` : r.priority, "num"),
    td(Number(r.waited_s).toFixed(1), "num"), td(r.who), td(r.reason)));
  const columns = [["#", "num"], ["tenant"], ["wants"], ["priority", "num"],
    ["waited (s)", "num"], ["driver"], ["reason"]];
  $("queue-box").replaceChildren(table("queue", columns, rows));
}

function drawTeams(teams) {
  const tenants = (teams && teams.tenants) || [];
  const parts = [];
  if (!teams || !teams.configured) parts.push(el("p", { class: "empty" }, "no quotas set"));
  if (tenants.length) {
    const rows = tenants.map((t) => el("tr", { class: "team", "data-tenant": t.tenant },
      td(t.tenant),
      td(t.slices),
      td(t.borrow), td(t.weight, "num"), td(t.held, "num"), td(t.borrowed, "num"),
      td(Number(t.usage || 0).toFixed(0), "num"), td(t.preemptions || 0, "num")));
    const columns = [["tenant"], ["quota"], ["borrow limit"], ["weight", "num"], ["held", "num"], ["borrowed", "num"],
      ["usage (slice-s)", "num"], ["preempted (recent)", "num"]];
    const tbl = table("teams", columns, rows);
    if (teams.half_life_s) {
      tbl.prepend(el("caption", {}, `usage decays with a half-life of ${duration(teams.half_life_s)}`));
    }
    parts.push(tbl);
  }
  $("teams-box").replaceChildren(...parts);
}

// --- runs --------------------------------------------------------------------------------

function runFacts(run) {
  const goodput = run.goodput === null || run.goodput === undefined
    ? "" : `goodput ${(run.goodput * 100).toFixed(0)}%`;
  return [
    el("a", { href: `/runs/${encodeURIComponent(run.run_id)}` }, run.run_id),
    el("span", {}, run.kind),
    el("span", {}, run.what),
    el("span", { class: "outcome" }, run.outcome || "running"),
    el("span", {}, duration(run.wall_s)),
    el("span", { class: "goodput" }, goodput),
  ];
}

/** The run's element, its chart created once and updated on later states. */
function runNode(run) {
  let entry = charts.get(run.run_id);
  if (entry === undefined) {
    const canvas = el("canvas", { class: "goodput-bar" });
    const node = el("div", { class: "run", "data-run": run.run_id },
      el("div", { class: "facts" }), el("div", { class: "bar-box" }, canvas));
    entry = { node, chart: new Chart(canvas, barConfig(run)) };
    charts.set(run.run_id, entry);
  } else {
    const chart = entry.chart;
    CATEGORIES.forEach((c, i) => { chart.data.datasets[i].data = [run.seconds[c] || 0]; });
    chart.options.scales.x.max = run.wall_s > 0 ? run.wall_s : undefined;
    chart.update("none");
  }
  entry.node.firstChild.replaceChildren(...runFacts(run));
  return entry.node;
}

function drawRuns(runs) {
  const listed = new Set(runs.map((r) => r.run_id));
  for (const [id, entry] of charts) {
    if (!listed.has(id)) {
      entry.chart.destroy();
      charts.delete(id);
    }
  }
  const nodes = runs.map(runNode);
  $("runs").replaceChildren(...(nodes.length ? nodes : [el("p", { class: "empty" }, "no runs yet")]));
}

function drawLegend() {
  $("runs-legend").replaceChildren(
    ...CATEGORIES.map((c) => el("span", { style: `--swatch: var(--cat-${c})` }, c.replace("_", " ")))
  );
}

// --- timeline ----------------------------------------------------------------------------

/** Fill a filter's options, keeping the user's choice (even if it is no longer listed). */
function fillSelect(select, values) {
  const chosen = select.value;
  const all = chosen && !values.includes(chosen) ? [...values, chosen] : values;
  const key = JSON.stringify(all);
  if (select.dataset.options === key) return; // unchanged: leave an open list alone
  select.dataset.options = key;
  select.replaceChildren(el("option", { value: "" }, "all"), ...all.map((v) => el("option", { value: v }, v)));
  select.value = chosen;
}

function applyFilters() {
  const slice = $("filter-slice").value;
  const tenant = $("filter-tenant").value;
  const rows = $("timeline").tBodies[0].rows;
  let shown = 0;
  for (const row of rows) {
    const match = (!slice || (eventSlices.get(row) || []).includes(slice))
      && (!tenant || row.dataset.tenant === tenant);
    row.hidden = !match;
    if (match) shown += 1;
  }
  const empty = $("timeline-empty");
  empty.hidden = shown > 0;
  empty.textContent = rows.length ? "no events match the filters" : "no events yet";
}

function drawTimeline(state) {
  fillSelect($("filter-slice"), state.slice_names || []);
  fillSelect($("filter-tenant"), state.tenants || []);
  const rows = (state.events || []).slice().reverse().map((e) => {
    const slices = e.slices || [];
    const attrs = {
      class: "event", "data-slices": slices.join(","), "data-tenant": e.tenant || "", "data-kind": e.kind,
    };
    const row = el("tr", attrs, td(clock(e.at), "time"), td(e.kind), td(e.text));
    eventSlices.set(row, slices);
    return row;
  });
  $("timeline").tBodies[0].replaceChildren(...rows);
  applyFilters();
}

/** The filters as the page's query parameters, so the view can be shared. */
function filtersChanged() {
  applyFilters();
  const params = new URLSearchParams();
  for (const name of FILTERS) {
    const value = $(`filter-${name}`).value;
    if (value) params.set(name, value);
  }
  const query = params.toString();
  history.replaceState(null, "", query ? `/?${query}` : "/");
}

function presetFilters() {
  const params = new URLSearchParams(location.search);
  for (const name of FILTERS) {
    const value = params.get(name);
    if (value) fillSelect($(`filter-${name}`), [value]);
    if (value) $(`filter-${name}`).value = value;
    $(`filter-${name}`).addEventListener("change", filtersChanged);
  }
}

// --- the stream --------------------------------------------------------------------------

function draw(state) {
  if (!state.connected) {
    showConnection(state.error || "the cluster could not be read");
    return; // the last picture stays
  }
  readAt = state.read_at;
  showConnection();
  drawCounts(state.counts || {});
  drawSlices(state.slices || []);
  drawQueue(state.queue || []);
  drawTeams(state.teams);
  drawRuns(state.runs || []);
  drawTimeline(state);
}

function listen() {
  const source = new EventSource("/api/stream");
  source.addEventListener("message", (message) => {
    streamed = true;
    draw(JSON.parse(message.data));
  });
  source.addEventListener("error", () => {
    showConnection("lost the connection to the dashboard server");
    if (source.readyState === EventSource.CLOSED) { // it gave up: start again later
      source.close();
      setTimeout(listen, 3000);
    }
  });
}

function start() {
  drawLegend();
  presetFilters();
  applyFilters();
  fetch("/api/state")
    .then((response) => (response.ok ? response.json() : null))
    .then((state) => { if (state && !streamed) draw(state); })
    .catch(() => {}); // the stream shows the trouble
  listen();
  setInterval(() => { if ($("connection").dataset.state === "connected") showConnection(); }, 1000);
}

start();
