// Small page behaviours shared by every page. htmx does the rest. No inline scripts (CSP).
"use strict";
// The socket's own element says whether it is open (`data-live`): a paged table swaps its
// stream container, and its new socket is the one that counts.

// --- The live connection ------------------------------------------------------------------
// Pages with a websocket (hx-ext="ws") show the connection in the top bar, announced politely
// to screen readers: "Live", then on a drop "Reconnecting…", and once the drop outlasts
// STALE_AFTER_MS "Stale since HH:MM" (viewer's clock; UTC on hover), so nobody mistakes a
// frozen page for a quiet fleet. The ws extension reconnects by itself; we only report.
const STALE_AFTER_MS = 5000;
const openSockets = new Set();
let droppedAt = null;
let staleTimer = null;

function banner() {
  return document.getElementById("connection");
}

function hhmm(date) {
  return date.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", hourCycle: "h23" });
}

function showConnection(state, text, title) {
  const el = banner();
  if (!el) return;
  el.hidden = false;
  if (el.dataset.state !== state || el.textContent !== text) {
    el.dataset.state = state;
    el.textContent = text;
  }
  el.title = title || "";
}

function markStale() {
  if (droppedAt === null || openSockets.size > 0) return;
  showConnection("stale", `Stale since ${hhmm(droppedAt)}`,
    `No live updates since ${droppedAt.toISOString().replace(".000", "")} (UTC); reconnecting…`);
}

document.addEventListener("htmx:wsConnecting", () => {
  if (openSockets.size === 0 && droppedAt === null) showConnection("connecting", "Connecting…");
});

document.addEventListener("htmx:wsOpen", (e) => {
  openSockets.add(e.target);
  droppedAt = null;
  clearTimeout(staleTimer);
  showConnection("live", "Live", "Live updates are arriving");
  document.querySelectorAll(".live-dot").forEach((d) => d.classList.add("connected"));
  e.detail.elt.setAttribute("data-live", "open");
});

document.addEventListener("htmx:wsClose", (e) => {
  openSockets.delete(e.target);
  document.querySelectorAll(".live-dot").forEach((d) => d.classList.remove("connected"));
  e.detail.elt.setAttribute("data-live", "closed");
  if (droppedAt === null) {
    droppedAt = new Date();
    showConnection("reconnecting", "Reconnecting…", "The live connection dropped; retrying");
    clearTimeout(staleTimer);
    staleTimer = setTimeout(markStale, STALE_AFTER_MS);
  }
});

// --- Confirmation on destructive actions ---------------------------------------------------
// Any button, link or form with data-confirm="…" asks first; "Cancel" stops the click (and the
// htmx request it would trigger) or the submit. Runs in the capture phase, before htmx.
function confirmed(el) {
  return window.confirm(el.getAttribute("data-confirm"));
}

document.addEventListener("click", (e) => {
  const el = e.target instanceof Element ? e.target.closest("[data-confirm]") : null;
  if (!el || el.tagName === "FORM") return;
  if (!confirmed(el)) {
    e.preventDefault();
    e.stopImmediatePropagation();
  }
}, true);

document.addEventListener("submit", (e) => {
  const form = e.target;
  if (!(form instanceof HTMLFormElement) || !form.hasAttribute("data-confirm")) return;
  if (!confirmed(form)) {
    e.preventDefault();
    e.stopImmediatePropagation();
  }
}, true);

// --- "/" focuses the search box in the top bar ----------------------------------------------
// Unless the person is typing somewhere already (a field, an editable element) or holds a
// modifier, so "/" in a reason or a filter stays a character.
document.addEventListener("keydown", (e) => {
  if (e.key !== "/" || e.ctrlKey || e.metaKey || e.altKey || e.defaultPrevented) return;
  const target = e.target instanceof Element ? e.target : null;
  if (target && target.closest("input, textarea, select, [contenteditable]")) return;
  const box = document.getElementById("global-search");
  if (!box) return;
  e.preventDefault();
  box.focus();
  box.select();
});

// --- Copy buttons ---------------------------------------------------------------------------
// `<button data-copy-target="ID">` copies the text of #ID (a one-time secret) and says so in
// the next `.copy-status`; where the clipboard is refused (no secure context) it selects the
// text instead, so Ctrl-C still works.
document.addEventListener("click", (e) => {
  const button = e.target.closest("button[data-copy-target]");
  if (!button) return;
  const source = document.getElementById(button.dataset.copyTarget);
  if (!source) return;
  const status = button.parentElement.querySelector(".copy-status");
  const say = (text) => { if (status) status.textContent = text; };
  const selectIt = () => {
    const range = document.createRange();
    range.selectNodeContents(source);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    say("Selected: press Ctrl-C (⌘-C) to copy.");
  };
  if (!navigator.clipboard || !window.isSecureContext) { selectIt(); return; }
  navigator.clipboard.writeText(source.textContent.trim()).then(
    () => say("Copied."),
    selectIt,
  );
});
