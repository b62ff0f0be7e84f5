// The fleet map: one square per worker on a canvas, drawn from the compact payload
// (controlplane/fleet/charts.py FleetMap): fetched from the URL in data-fleet-map-src on the
// source page, inline in the data-fleet-map attribute on the map's own page and its re-read.
// At 10,000 workers an SVG with a linked <rect> and <title> per worker was 1.7 MB to parse and 30,000
// nodes to style and lay out (2-3 s in Chromium); here the browser parses numbers and paints
// squares. Static file, no inline script (CSP); outside text (keys, versions) is only ever set
// as text, never as HTML.
//
// What the SVG gave stays: each cell's colour (version when live, state otherwise), the
// worker's key, state and version on hover (the canvas's tooltip and the line under it), and
// its link (click, or Ctrl/Cmd-click for a new tab). The keyboard moves a focused cell with
// the arrow keys, Home and End, and opens it with Enter; the line under the map is a polite
// live region, so the focused worker is read out. The summary sentence above the map is its
// text alternative.
"use strict";

// Values per cell in the payload's flat `cells` array (CELL_FIELDS on the server).
const CELL_FIELDS = 6;
const SIZE = 9;
const PITCH = SIZE + 1;

function cssColour(cls) {
  // chart-v0 … and chart-<state> are custom properties of the page (app.css): dark mode too.
  const value = getComputedStyle(document.documentElement).getPropertyValue(`--${cls}`).trim();
  return value || "#64748b";
}

class FleetMap {
  constructor(root, data) {
    this.root = root;
    this.data = data;
    this.count = this.data.cells.length / CELL_FIELDS;
    [this.before, this.after] = this.data.href.split("{}");
    this.canvas = root.querySelector("canvas");
    this.line = root.querySelector(".fleet-map-focus");
    this.colours = this.data.classes.map(cssColour);
    this.focused = -1;
    this.columns = 0;
    this.canvas.addEventListener("mousemove", (e) => this.hover(e));
    this.canvas.addEventListener("mouseleave", () => this.show(this.focused));
    this.canvas.addEventListener("click", (e) => this.open(this.at(e), e.ctrlKey || e.metaKey));
    this.canvas.addEventListener("keydown", (e) => this.key(e));
    this.canvas.addEventListener("focus", () => this.focus(Math.max(this.focused, 0)));
    new ResizeObserver(() => this.draw()).observe(root);
  }

  draw() {
    const width = this.root.clientWidth || 640;
    const columns = Math.max(16, Math.floor((width + 1) / PITCH));
    if (columns === this.columns) return;
    this.columns = columns;
    const rows = Math.max(1, Math.ceil(this.count / columns));
    const ratio = window.devicePixelRatio || 1;
    const canvas = this.canvas;
    canvas.width = Math.round(columns * PITCH * ratio);
    canvas.height = Math.round(rows * PITCH * ratio);
    canvas.style.width = `${columns * PITCH}px`;
    canvas.style.height = `${rows * PITCH}px`;
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    const cells = this.data.cells;
    // One path per colour: a handful of fills, whatever the fleet's size.
    this.colours.forEach((colour, c) => {
      ctx.beginPath();
      for (let i = 0; i < this.count; i++) {
        if (cells[i * CELL_FIELDS + 5] !== c) continue;
        ctx.rect((i % columns) * PITCH, Math.floor(i / columns) * PITCH, SIZE, SIZE);
      }
      ctx.fillStyle = colour;
      ctx.fill();
    });
    if (this.focused >= 0) this.outline(this.focused, true);
    this.root.dataset.drawn = String(this.count);
    this.root.dataset.columns = String(columns);
  }

  at(event) {
    const box = this.canvas.getBoundingClientRect();
    const col = Math.floor((event.clientX - box.left) / PITCH);
    const row = Math.floor((event.clientY - box.top) / PITCH);
    const i = row * this.columns + col;
    return col >= 0 && col < this.columns && i >= 0 && i < this.count ? i : -1;
  }

  title(i) {
    const { prefixes, states, versions, cells } = this.data;
    const at = i * CELL_FIELDS;
    return `${prefixes[cells[at + 1]]}${cells[at + 2]} · ${states[cells[at + 3]]} · ${versions[cells[at + 4]]}`;
  }

  href(i) {
    return this.before + this.data.cells[i * CELL_FIELDS] + this.after;
  }

  show(i) {
    const text = i >= 0 ? this.title(i) : "";
    this.canvas.title = text;
    if (this.line.textContent !== text) this.line.textContent = text;
    this.line.dataset.href = i >= 0 ? this.href(i) : "";
  }

  hover(event) {
    const i = this.at(event);
    this.canvas.style.cursor = i >= 0 ? "pointer" : "";
    this.show(i);
  }

  open(i, elsewhere) {
    if (i < 0) return;
    if (elsewhere) window.open(this.href(i), "_blank", "noopener");
    else window.location.assign(this.href(i));
  }

  outline(i, on) {
    const ctx = this.canvas.getContext("2d");
    const x = (i % this.columns) * PITCH;
    const y = Math.floor(i / this.columns) * PITCH;
    ctx.fillStyle = this.colours[this.data.cells[i * CELL_FIELDS + 5]];
    ctx.fillRect(x, y, SIZE, SIZE);
    if (on) {
      ctx.strokeStyle = cssColour("chart-text");
      ctx.lineWidth = 2;
      ctx.strokeRect(x + 1, y + 1, SIZE - 2, SIZE - 2);
    }
  }

  focus(i) {
    if (this.count === 0) return;
    const next = Math.min(Math.max(i, 0), this.count - 1);
    if (this.focused >= 0) this.outline(this.focused, false);
    this.focused = next;
    this.outline(next, true);
    this.show(next);
  }

  key(event) {
    const moves = {
      ArrowRight: 1,
      ArrowLeft: -1,
      ArrowDown: this.columns,
      ArrowUp: -this.columns,
      Home: -this.count,
      End: this.count,
    };
    if (event.key in moves) {
      event.preventDefault();
      this.focus(this.focused + moves[event.key]);
    } else if (event.key === "Enter") {
      event.preventDefault();
      this.open(this.focused, event.ctrlKey || event.metaKey);
    }
  }
}

// The source page's map carries no data: its frame names the URL of it (data-fleet-map-src),
// which the page's head preloads with these credentials, so this fetch is handed the response
// already on its way. The summary and legend come with it and are set as text.
function fetchData(url) {
  return fetch(url, { credentials: "include", headers: { Accept: "application/json" } }).then(
    (answer) => {
      if (!answer.ok) throw new Error(`HTTP ${answer.status}`);
      return answer.json();
    },
  );
}

// Asked for when this script runs (the head's preload names it), used once by its frame: a
// page restored from history asks again.
const early = new Map();

// Every stylesheet applied: the colours are the page's custom properties and the width its
// layout's (an async script may run before they are). Once the page is parsed they are (the
// deferred scripts wait for them), so a stylesheet that failed never holds the map longer.
function stylesheets() {
  if (document.readyState !== "loading") return Promise.resolve();
  return new Promise((done) => {
    document.addEventListener("DOMContentLoaded", done, { once: true });
    const pending = [...document.querySelectorAll('link[rel="stylesheet"]')].filter(
      (link) => !link.sheet,
    );
    Promise.all(
      pending.map((link) => new Promise((loaded) => link.addEventListener("load", loaded))),
    ).then(done);
  });
}

function fill(root, data) {
  root.querySelector(".fleet-map-summary").textContent = data.summary;
  const canvas = root.querySelector("canvas");
  canvas.hidden = false; // an empty, focusable canvas until now: hidden without a script
  canvas.dataset.count = String(data.count);
  canvas.setAttribute(
    "aria-label",
    `Fleet map: ${data.count} workers; arrow keys move between workers, Enter opens one`,
  );
  const legend = root.querySelector(".fleet-map-legend");
  legend.replaceChildren(); // a frame restored from history carries the legend it had
  for (const [name, cls] of data.legend) {
    const item = document.createElement("li");
    const swatch = document.createElement("span");
    swatch.className = `chart-swatch ${cls}`;
    item.append(swatch, ` ${name}`);
    legend.append(item);
  }
}

async function load(root) {
  const url = new URL(root.dataset.fleetMapSrc, document.baseURI).href;
  const pending = early.get(url) || fetchData(url);
  early.delete(url);
  try {
    const data = await pending;
    await stylesheets();
    if (!root.isConnected) return; // replaced (a push's re-read) while it loaded
    fill(root, data);
    root.fleetMap = new FleetMap(root, data);
    root.fleetMap.draw();
  } catch (error) {
    // The link to the map's own page stays; say why the picture is missing.
    root.fleetMap = null;
    const note = document.createElement("span");
    note.className = "muted";
    note.textContent = ` (the map could not be loaded: ${error.message})`;
    root.querySelector(".fleet-map-summary").append(note);
  }
}

function drawWithin(node) {
  if (!(node instanceof Element)) return;
  const roots = node.matches("[data-fleet-map]") ? [node] : [];
  roots.push(...node.querySelectorAll("[data-fleet-map]"));
  for (const root of roots) {
    if (root.fleetMap !== undefined) continue;
    // While the page is still parsed, a frame is whole once its last part, the legend, is in.
    if (document.readyState === "loading" && !root.querySelector(".fleet-map-legend")) continue;
    if (root.dataset.fleetMap) {
      root.fleetMap = "loading";
      stylesheets().then(() => {
        root.fleetMap = new FleetMap(root, JSON.parse(root.dataset.fleetMap));
        root.fleetMap.draw();
      });
    } else if (root.dataset.fleetMapSrc) {
      root.fleetMap = "loading";
      load(root);
    }
  }
}

// This script is async: it may run while the page is parsed or after. The source page's data
// is asked for at once and drawn as soon as it is in (if its frame is parsed by then); the rest
// is drawn when the page is parsed. htmx fires htmx:load on each swapped-in element, so a
// push's re-read is drawn too.
for (const link of document.querySelectorAll("link[data-fleet-map-data]")) {
  const pending = fetchData(link.href);
  early.set(link.href, pending);
  pending.then(
    () => drawWithin(document.body),
    () => {}, // reported by the frame's own load
  );
}
document.addEventListener("htmx:load", (e) => drawWithin(e.target));
if (document.readyState === "loading") {
  document.addEventListener("DOMContentLoaded", () => drawWithin(document.body));
} else {
  drawWithin(document.body);
}
