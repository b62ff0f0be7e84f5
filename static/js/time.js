// Show every <time data-local> in the viewer's own zone, with the zone's abbreviation.
// The server rendered UTC with "UTC" written out and the UTC moment in the title; we only
// rewrite the visible text, so hover still shows UTC and the page is correct without JS.
// Runs on load and after every htmx swap (live updates bring new <time> elements).
(function () {
  "use strict";
  var formats = {
    full: { year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23", timeZoneName: "short" },
    minute: { year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit", hourCycle: "h23", timeZoneName: "short" },
    time: { hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23", timeZoneName: "short" }
  };
  var cache = {};
  function formatter(style) {
    if (!cache[style]) {
      cache[style] = new Intl.DateTimeFormat("en-CA", formats[style] || formats.full);
    }
    return cache[style];
  }
  function text(date, style) {
    // en-CA gives ISO-like dates (2026-11-30); join the parts ourselves for a stable shape.
    var parts = {};
    formatter(style).formatToParts(date).forEach(function (p) { parts[p.type] = p.value; });
    var clock = parts.hour + ":" + parts.minute + (parts.second ? ":" + parts.second : "");
    var day = parts.year ? parts.year + "-" + parts.month + "-" + parts.day + " " : "";
    return day + clock + " " + (parts.timeZoneName || "");
  }
  function localise(root) {
    var nodes = (root || document).querySelectorAll("time[data-local]");
    for (var i = 0; i < nodes.length; i++) {
      var node = nodes[i];
      var date = new Date(node.getAttribute("datetime"));
      if (isNaN(date.getTime())) { continue; }
      node.textContent = text(date, node.getAttribute("data-local"));
      node.setAttribute("data-localised", "");
    }
  }
  document.addEventListener("DOMContentLoaded", function () { localise(document); });
  document.addEventListener("htmx:afterSwap", function (e) { localise(e.target); });
  document.addEventListener("htmx:oobAfterSwap", function (e) { localise(e.target); });
  document.addEventListener("htmx:wsAfterMessage", function () { localise(document); });
})();
