// The approval inbox badge in the top bar (controlplane/refresh/inbox.py): a plain websocket
// to ws/inbox/ carrying {"count": n}. Not the htmx ws extension: the top bar's "Live"
// indicator speaks for a page's own stream, and this socket is on every page. On a drop it
// reconnects with a growing pause; the server's resync on connect sends the current count.
"use strict";

(function () {
  const badge = document.getElementById("inbox-badge");
  if (!badge || !("WebSocket" in window)) return;
  const link = badge.closest("a");
  const MAX_PAUSE_MS = 10000;
  let pause = 500;

  function show(count) {
    badge.textContent = String(count);
    badge.hidden = count === 0;
    badge.dataset.count = String(count);
    if (link) {
      link.setAttribute(
        "aria-label",
        count === 0 ? "Inbox: nothing awaits your approval" : `Inbox: ${count} awaiting your approval`,
      );
    }
  }

  function connect() {
    const scheme = window.location.protocol === "https:" ? "wss:" : "ws:";
    const socket = new WebSocket(`${scheme}//${window.location.host}/ws/inbox/`);
    socket.addEventListener("open", () => { pause = 500; });
    socket.addEventListener("message", (e) => {
      let count;
      try {
        count = JSON.parse(e.data).count;
      } catch (_) {
        return;
      }
      if (Number.isInteger(count) && count >= 0) show(count);
    });
    socket.addEventListener("close", (e) => {
      if (e.code === 4403) return; // refused: this user may not approve; nothing to show
      setTimeout(connect, pause);
      pause = Math.min(pause * 2, MAX_PAUSE_MS);
    });
  }

  connect();
  // Leaving the page closes the socket without a reconnect racing the unload.
  window.addEventListener("pagehide", () => { pause = MAX_PAUSE_MS; });
}());
