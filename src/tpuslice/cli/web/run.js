// One run's page (/runs/<run id>): its goodput account from /api/runs/<run id>.
// Plain DOM code: every text from the cluster goes in through textContent, never as HTML.
"use strict";

function seconds(s) {
  return `${Number(s || 0).toFixed(1)} s`;
}

function share(s, wall) {
  return wall > 0 ? `${((100 * (s || 0)) / wall).toFixed(1)}%` : "";
}

function showError(text) {
  $("error").textContent = text;
  $("error").hidden = false;
}

function drawFacts(run) {
  const started = run.started_at ? new Date(run.started_at * 1000).toLocaleString() : "";
  const goodput = run.goodput === null || run.goodput === undefined
    ? "" : `${(run.goodput * 100).toFixed(1)}%`;
  const facts = [
    ["started", started],
    ["wall time", seconds(run.wall_s)],
    ["goodput", goodput],
    ["attempts", run.attempts],
    ["checkpoints", run.checkpoints],
    ["Ray job", run.job],
  ];
  $("facts").replaceChildren(
    ...facts.flatMap(([name, value]) => [el("dt", {}, name), el("dd", {}, value ?? "")])
  );
}

function drawChart(run) {
  const config = barConfig(run);
  config.options.scales.x = { ...config.options.scales.x, display: true, title: { display: true, text: "seconds" } };
  config.options.plugins.legend = { display: true, position: "bottom", labels: { boxWidth: 12 } };
  return new Chart($("run-bar"), config);
}

function drawTables(run) {
  const wall = run.wall_s;
  const rows = CATEGORIES.map((c) =>
    el(
      "tr",
      { "data-category": c },
      el("td", {}, c.replace("_", " ")),
      el("td", { class: "num" }, seconds(run.seconds[c])),
      el("td", { class: "num" }, share(run.seconds[c], wall))
    )
  );
  $("seconds-box").replaceChildren(
    table("seconds", [["category"], ["seconds", "num"], ["share", "num"]], rows)
  );

  const lost = Object.entries(run.lost || {});
  $("lost-box").replaceChildren(
    lost.some(([, s]) => s > 0)
      ? table(
          "lost",
          [["cause"], ["seconds lost", "num"]],
          lost.map(([cause, s]) =>
            el("tr", { "data-cause": cause }, el("td", {}, cause.replace("_", " ")), el("td", { class: "num" }, seconds(s)))
          )
        )
      : el("p", { class: "empty" }, "no work lost")
  );

  const notes = run.notes || [];
  $("notes-box").replaceChildren(
    notes.length
      ? el("ul", { id: "notes" }, ...notes.map((n) => el("li", {}, n)))
      : el("p", { class: "empty" }, "no notes")
  );

  const slices = run.slices || [];
  $("slices-box").replaceChildren(
    slices.length
      ? el(
          "ul",
          { id: "run-slices" },
          ...slices.map((s) =>
            el("li", {}, el("a", { href: `/?slice=${encodeURIComponent(s)}`, title: "its timeline" }, s))
          )
        )
      : el("p", { class: "empty" }, "no slices")
  );
}

async function main() {
  const runId = decodeURIComponent(location.pathname.replace(/\/+$/, "").split("/").pop());
  $("run-id").textContent = runId;
  document.title = `tpuslice · run ${runId}`;
  let response;
  let body;
  try {
    response = await fetch(`/api/runs/${encodeURIComponent(runId)}`);
    body = await response.json();
  } catch (err) {
    showError(`could not read the run: ${err.message}`);
    return;
  }
  if (!response.ok || !body.run) {
    showError(body.error || `the server answered ${response.status}`);
    return;
  }
  const run = body.run;
  $("summary").textContent = [run.kind, run.what, run.outcome || "running"].filter(Boolean).join(" · ");
  $("run").hidden = false;
  drawFacts(run);
  drawChart(run);
  drawTables(run);
}

main();
