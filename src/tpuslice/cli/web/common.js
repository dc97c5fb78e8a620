// What both pages share: DOM helpers, the goodput categories and the bar they draw.
// Plain DOM code: every text from the cluster goes in through textContent, never as HTML.
"use strict";

const CATEGORIES = [
  "queued", "reserving", "starting", "productive",
  "checkpointing", "lost", "recovering", "handing_back",
];

const $ = (id) => document.getElementById(id);

/** An element with attributes (null ones left out) and children (strings become text). */
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value !== null && value !== undefined) node.setAttribute(name, String(value));
  }
  for (const child of children) {
    if (child !== null && child !== undefined && child !== false) {
      node.append(child instanceof Node ? child : String(child));
    }
  }
  return node;
}

/** A table with a header row; `columns` are [heading, class] pairs. */
function table(id, columns, rows) {
  const head = el("tr", {}, ...columns.map(([name, cls]) => el("th", { class: cls }, name)));
  return el("table", { id }, el("thead", {}, head), el("tbody", {}, ...rows));
}

/** A goodput category's colour, from the stylesheet's --cat-<category>. */
function categoryColour(category) {
  const value = getComputedStyle(document.documentElement).getPropertyValue(`--cat-${category}`);
  return value.trim() || "#999";
}

/** Chart.js's configuration of a run's goodput bar: one stacked horizontal bar of its
 *  seconds per category, no axes or legend (a page adds them where it wants them). */
function barConfig(run) {
  return {
    type: "bar",
    data: {
      labels: [""],
      datasets: CATEGORIES.map((c) => ({
        label: c.replace("_", " "),
        data: [run.seconds[c] || 0],
        backgroundColor: categoryColour(c),
        barPercentage: 1,
        categoryPercentage: 1,
      })),
    },
    options: {
      indexAxis: "y",
      animation: false,
      responsive: true,
      maintainAspectRatio: false,
      scales: {
        x: { stacked: true, display: false, min: 0, max: run.wall_s > 0 ? run.wall_s : undefined },
        y: { stacked: true, display: false },
      },
      plugins: {
        legend: { display: false },
        tooltip: { callbacks: { label: (c) => `${c.dataset.label}: ${c.parsed.x.toFixed(1)} s` } },
      },
    },
  };
}
