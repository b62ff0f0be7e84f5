"""Take the README's and the docs' screenshots from a running `manage.py demo` in headless Chromium.

    python manage.py demo --port 8000            # in one terminal; run one policy refresh, e.g.
    python manage.py policy_refresh sim --weight-version step-200 \\
        --model-path /ckpt/step-200 --as demo-operator --yes
    python docs/screenshots/capture.py --base http://127.0.0.1:8000 \\
        --user demo-operator --password <from the demo's welcome> --refresh 1

Writes fleet-overview.png, policy-refresh.png and gates.png next to this file. The viewport is
a laptop screen; each picture is the top of its page (at most 900 px), as an operator first
sees it.
"""

import argparse
import os
from pathlib import Path

from playwright.sync_api import sync_playwright

HERE = Path(__file__).resolve().parent
CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
VIEWPORT = {"width": 1280, "height": 800}
# Short pages are cut below their content instead of padded with blank page; long ones stop here.
MAX_HEIGHT = 900


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the demo's URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--user", required=True)
    parser.add_argument("--password", required=True)
    parser.add_argument("--refresh", type=int, required=True, help="policy refresh id to show")
    args = parser.parse_args()
    base = args.base.rstrip("/")
    shots = {
        "fleet-overview.png": "/",
        "policy-refresh.png": f"/refreshes/{args.refresh}/",
        "gates.png": "/refreshes/gates/",
    }
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(f"{base}/accounts/login/")
        page.fill("input[name=username]", args.user)
        page.fill("input[name=password]", args.password)
        page.click("button[type=submit]")
        page.wait_for_url(f"{base}/")
        for name, path in shots.items():
            page.goto(base + path)
            page.wait_for_load_state("networkidle")
            height = min(page.evaluate("document.body.scrollHeight") + 16, MAX_HEIGHT)
            clip = {"x": 0, "y": 0, "width": VIEWPORT["width"], "height": height}
            page.screenshot(path=HERE / name, full_page=True, clip=clip)
            print(HERE / name)
        browser.close()


if __name__ == "__main__":
    main()
