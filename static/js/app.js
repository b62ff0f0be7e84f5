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

// --- Dialogs of our own on dangerous actions ------------------------------------------------
// `<button type="button" data-dialog="ID">` opens `<dialog id="ID">` (rendered by the server
// inside the action's form, saying what the action touches and what trainers will see); its
// submit button submits that form, its `data-dialog-close` button (or Escape) cancels.
// Anything else with data-confirm="…" gets the same kind of dialog with that one sentence,
// built here once: no native confirm() anywhere.
function openDialog(dialog, opener) {
  if (!(dialog instanceof HTMLDialogElement)) return;
  dialog.returnFocusTo = opener;
  dialog.showModal();
  const field = dialog.querySelector("input:not([type=hidden]), textarea, select");
  (field || dialog.querySelector("[data-dialog-submit]") || dialog).focus();
}

document.addEventListener("click", (e) => {
  const target = e.target instanceof Element ? e.target : null;
  if (!target) return;
  const opener = target.closest("[data-dialog]");
  if (opener) {
    e.preventDefault();
    openDialog(document.getElementById(opener.getAttribute("data-dialog")), opener);
    return;
  }
  const close = target.closest("[data-dialog-close]");
  if (close) {
    const dialog = close.closest("dialog");
    if (dialog) dialog.close();
  }
});

document.addEventListener("close", (e) => {
  const dialog = e.target;
  if (dialog instanceof HTMLDialogElement && dialog.returnFocusTo) dialog.returnFocusTo.focus();
}, true);

// A live update must not pull an open dialog from under the person reading it: the swap waits,
// and once the dialog closes without being submitted the page reloads to catch up.
let heldBackSwap = false;
function holdIfDialogOpen(e) {
  const target = e.detail && e.detail.target;
  if (!(target instanceof Element)) return;
  if (target.matches("dialog[open]") || target.querySelector("dialog[open]")) {
    e.detail.shouldSwap = false;
    heldBackSwap = true;
  }
}
document.addEventListener("htmx:oobBeforeSwap", holdIfDialogOpen);
document.addEventListener("htmx:beforeSwap", holdIfDialogOpen);
document.addEventListener("close", (e) => {
  if (!(e.target instanceof HTMLDialogElement) || !heldBackSwap) return;
  if (document.querySelector("dialog[open]")) return;
  // A submit navigates anyway; only a cancelled dialog needs the page brought up to date.
  setTimeout(() => { if (!document.querySelector("form[data-submitting]")) location.reload(); }, 0);
}, true);
document.addEventListener("submit", (e) => {
  if (e.target instanceof HTMLFormElement && !e.defaultPrevented) e.target.setAttribute("data-submitting", "");
});

let confirmDialog = null;
let confirmPending = null;

function confirmDialogFor(text) {
  if (!confirmDialog) {
    confirmDialog = document.createElement("dialog");
    confirmDialog.className = "consequence";
    confirmDialog.id = "confirm-dialog";
    const question = document.createElement("p");
    question.className = "confirm-question";
    const actions = document.createElement("div");
    actions.className = "actions dialog-actions";
    const cancel = document.createElement("button");
    cancel.type = "button";
    cancel.textContent = "Cancel";
    cancel.setAttribute("data-dialog-close", "");
    const ok = document.createElement("button");
    ok.type = "button";
    ok.className = "danger";
    ok.id = "confirm-dialog-ok";
    ok.textContent = "Confirm";
    ok.addEventListener("click", () => {
      const pending = confirmPending;
      confirmPending = null;
      confirmDialog.close();
      if (pending) pending();
    });
    actions.append(cancel, ok);
    confirmDialog.append(question, actions);
    document.body.append(confirmDialog);
  }
  confirmDialog.querySelector(".confirm-question").textContent = text;
  return confirmDialog;
}

// Capture phase, before htmx: the first click only asks; the confirmed one goes through.
document.addEventListener("click", (e) => {
  const el = e.target instanceof Element ? e.target.closest("[data-confirm]") : null;
  if (!el || el.tagName === "FORM") return;
  if (el.dataset.confirmed === "1") { delete el.dataset.confirmed; return; }
  e.preventDefault();
  e.stopImmediatePropagation();
  confirmPending = () => { el.dataset.confirmed = "1"; el.click(); };
  openDialog(confirmDialogFor(el.getAttribute("data-confirm")), el);
}, true);

document.addEventListener("submit", (e) => {
  const form = e.target;
  if (!(form instanceof HTMLFormElement) || !form.hasAttribute("data-confirm")) return;
  if (form.dataset.confirmed === "1") { delete form.dataset.confirmed; return; }
  e.preventDefault();
  e.stopImmediatePropagation();
  confirmPending = () => { form.dataset.confirmed = "1"; form.requestSubmit(); };
  openDialog(confirmDialogFor(form.getAttribute("data-confirm")), form);
}, true);

// --- The plan form shows the chosen update method's fields only ------------------------------
// Method-specific fields sit in groups, `data-method-fields="METHOD ..."` naming the methods that
// use them; the server hides the groups of other methods, and a change of method swaps them.
document.addEventListener("change", (e) => {
  const select = e.target;
  if (!(select instanceof HTMLSelectElement) || !select.matches("[data-method-select]")) return;
  document.querySelectorAll("[data-method-fields]").forEach((group) => {
    group.hidden = !group.getAttribute("data-method-fields").split(" ").includes(select.value);
  });
});

// --- A flash message about a refresh goes stale once the refresh moves on -------------------
// The message ("Retrying…", "Started") was true for the state the page loaded in; when the live
// cockpit says the refresh is in another state, the message is about the past: remove it.
let loadedState = null;
function dropStaleMessages() {
  const cockpit = document.getElementById("cockpit");
  if (!cockpit) return;
  const now = cockpit.getAttribute("data-state");
  if (loadedState === null) { loadedState = now; return; }
  if (now !== loadedState) document.querySelectorAll(".messages").forEach((m) => m.remove());
}
document.addEventListener("DOMContentLoaded", dropStaleMessages);
document.addEventListener("htmx:oobAfterSwap", dropStaleMessages);

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
