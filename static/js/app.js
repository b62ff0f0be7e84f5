// Small page behaviours shared by every page. htmx does the rest.
// Shows whether the live websocket is connected, so nobody mistakes a stale page for a quiet fleet.
document.addEventListener("htmx:wsOpen", (e) => {
  document.querySelectorAll(".live-dot").forEach((d) => d.classList.add("connected"));
});
document.addEventListener("htmx:wsClose", (e) => {
  document.querySelectorAll(".live-dot").forEach((d) => d.classList.remove("connected"));
});
