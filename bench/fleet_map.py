"""The fleet map at fleet scale in a real browser: prints figures, asserts nothing.

    DATABASE_URL=postgres://... .venv/bin/python bench/fleet_map.py [--workers 2000] [--runs 7]

Prepares a throwaway PostgreSQL database (`bench/_servers.py`) with one source of N workers
(4 namespaces, 3 versions), serves it with uvicorn as production runs it (2 workers, DEBUG
off), and drives Debian's Chromium (`/usr/bin/chromium`, headless, through Playwright) as a
signed-in viewer: each run opens the source page in a fresh page (warm browser cache for the
static files, as a returning operator has) and measures, with the browser's own clock, the time
from navigation start until the map has drawn its N cells and until the frame after that is
painted (the map's data is a request of its own, preloaded by the page's head, so this is
what a person waits for), with the map request's resource timing (server, transfer, bytes).
Prints per run the times and their split, then median and range against the limit of one
second (on the painted time), and one summary line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# _servers configures the bench process on import: DEBUG off, a Redis prefix of its own.
from _servers import (
    server_database_url,
    session_cookie,
    start_uvicorn,
    throwaway_database,
)

LIMIT_MS = 1000.0
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _fill(workers: int) -> int:
    from controlplane.audit.recorder import Actor
    from controlplane.fleet import services
    from tests.fixtures.scale import make_fleet

    source = services.create_source(
        actor=Actor.system("bench"),
        name="bench-map",
        listener_url="http://10.0.0.5:8001",
        allowed_networks=["10.0.0.0/8"],
    )
    make_fleet(source, workers)
    return source.pk


# The map's cells drawn: the count the canvas map (static/js/fleet_map.js) reports once it has
# painted them, or, to compare with the code before it, the SVG's rects.
_CELLS_DRAWN = """
() => {
  const map = document.querySelector('#fleet-map-cells [data-fleet-map][data-drawn]');
  if (map) return Number(map.dataset.drawn);
  return document.querySelectorAll('#fleet-map-cells svg rect.chart-cell').length;
}
"""

# Times from navigation start (performance.now() is measured from the navigation's time
# origin) until `count` map cells are drawn, and until the frame after that has been produced
# (two animation frames: style, layout and paint done), with the page's navigation timing and
# the map request's resource timing, so the time splits into first screen, server, transfer,
# drawing the cells, and layout and paint.
_WAIT_FOR_CELLS = (
    """
(count) => new Promise((resolve) => {
  const drawn = """
    + _CELLS_DRAWN
    + """;
  const done = () => drawn() >= count;
  const finish = () => {
    const cells = performance.now();
    requestAnimationFrame(() => requestAnimationFrame(() => {
      const map = performance.getEntriesByType('resource').filter((e) => e.name.includes('/map'));
      const r = map[map.length - 1] || {};
      const nav = performance.getEntriesByType('navigation')[0] || {};
      resolve({cells, painted: performance.now(), requestStart: r.requestStart || 0,
               responseStart: r.responseStart || 0, responseEnd: r.responseEnd || 0,
               bytes: r.decodedBodySize || 0, wire: r.encodedBodySize || 0,
               pageServer: (nav.responseStart || 0) - (nav.requestStart || 0),
               pageLoaded: nav.domContentLoadedEventEnd || 0, drawn: drawn()});
    }));
  };
  if (done()) { finish(); return; }
  new MutationObserver((_, observer) => {
    if (done()) { observer.disconnect(); finish(); }
  }).observe(document, {childList: true, subtree: true, attributes: true,
                        attributeFilter: ['data-drawn']});
})
"""
)


def _range(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} ms ({min(values):.0f}-{max(values):.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    if not os.path.exists(CHROMIUM):
        raise SystemExit(f"{CHROMIUM} is missing: apt-get install chromium chromium-driver")

    from playwright.sync_api import sync_playwright

    with throwaway_database("bench_fleet_map") as dbname:
        source_id = _fill(args.workers)
        cookie = session_cookie()
        server = start_uvicorn(server_database_url(dbname, "cp-bench-map"), 2)
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
                context = browser.new_context(base_url=server.url)
                context.add_cookies(
                    [{"name": k, "value": v, "url": server.url} for k, v in cookie.items()]
                )
                url = f"/sources/{source_id}/"
                warm = context.new_page()
                warm.goto(url)
                warm.evaluate(_WAIT_FOR_CELLS, args.workers)
                warm.close()
                times: list[float] = []
                painted: list[float] = []
                for run in range(1, args.runs + 1):
                    page = context.new_page()
                    page.goto(url, wait_until="commit")
                    t = page.evaluate(_WAIT_FOR_CELLS, args.workers)
                    cells = t["drawn"]
                    page.close()
                    times.append(t["cells"])
                    painted.append(t["painted"])
                    print(
                        f"  run {run}: {t['cells']:7.1f} ms to {cells} cells, "
                        f"{t['painted']:7.1f} ms painted · source page server "
                        f"{t['pageServer']:.0f} ms, DOM ready {t['pageLoaded']:.0f}, "
                        f"map request sent at {t['requestStart']:.0f}, "
                        f"server {t['responseStart'] - t['requestStart']:.0f} ms, "
                        f"transfer {t['responseEnd'] - t['responseStart']:.0f} ms, "
                        f"{t['bytes'] / 1000:.0f} KB ({t['wire'] / 1000:.0f} KB on the wire), "
                        f"cells built {t['cells'] - t['responseEnd']:.0f} ms after, "
                        f"layout and paint {t['painted'] - t['cells']:.0f} ms"
                    )
                browser.close()
        finally:
            server.stop()

    met = "met" if statistics.median(painted) < LIMIT_MS else "NOT met"
    load = os.getloadavg()[0]
    print(
        f"fleet map @ {args.workers} workers over {len(times)} runs: cells in the document "
        f"{_range(times)}, painted {_range(painted)}, limit {LIMIT_MS:.0f} ms: {met}; "
        f"load average {load:.1f} on {os.cpu_count()} CPUs"
    )


if __name__ == "__main__":
    main()
