// Small page behaviours shared by every page. htmx does the rest.
// Shows whether the live websocket is connected, so nobody mistakes a stale page for a quiet fleet.
// The socket's own element says so too (`data-live`): a paged table swaps its stream container,
// and its new socket is the one that counts.
document.addEventListener("htmx:wsOpen", (e) => {
  document.querySelectorAll(".live-dot").forEach((d) => d.classList.add("connected"));
  e.detail.elt.setAttribute("data-live", "open");
});
document.addEventListener("htmx:wsClose", (e) => {
  document.querySelectorAll(".live-dot").forEach((d) => d.classList.remove("connected"));
  e.detail.elt.setAttribute("data-live", "closed");
});
