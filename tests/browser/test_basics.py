"""Site-wide basics in Chromium: dark mode, a 390 px screen, confirmation before destructive
actions, error pages inside the layout and the live connection banner."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connections
from django.utils import timezone

from controlplane.fleet.models import Source
from controlplane.refresh.models import Gate, GateState, PolicyRefresh, RefreshState
from tests.conftest import PASSWORD
from tests.fixtures.live_server import sign_in
from tests.integration.refresh.helpers import actor_for, make_source, plan, run_inline

pytestmark = pytest.mark.browser


def _elsewhere(fn):
    """Run `fn` on another thread (Playwright keeps an event loop in this one)."""

    def run():
        try:
            return fn()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def _background(page) -> str:
    return page.evaluate("getComputedStyle(document.body).backgroundColor")


def test_dark_mode_follows_the_system_setting(page, viewer, transactional_db):
    sign_in(page, viewer.username, PASSWORD)
    page.emulate_media(color_scheme="light")
    page.goto("/")
    assert _background(page) == "rgb(246, 247, 249)"
    page.emulate_media(color_scheme="dark")
    assert _background(page) == "rgb(15, 20, 25)"
    ink = page.evaluate("getComputedStyle(document.querySelector('main h1')).color")
    assert ink == "rgb(230, 233, 237)"


def test_main_pages_fit_a_390_px_screen(page, simfleet, operator, transactional_db):
    source = make_source(simfleet)
    refresh = _elsewhere(lambda: run_inline(source, operator, version="v-narrow"))
    assert refresh.state == RefreshState.SUCCEEDED
    sign_in(page, operator.username, PASSWORD)
    page.set_viewport_size({"width": 390, "height": 844})
    pages = [
        "/",
        f"/sources/{source.pk}/",
        "/refreshes/",
        f"/refreshes/{refresh.pk}/",
        "/refreshes/gates/",
        "/refreshes/new/",
        "/history/",
        "/versions/v-narrow/provenance/",
        f"/workers/{source.workers.first().pk}/",
    ]
    wide = {}
    for url in pages:
        page.goto(url)
        width = page.evaluate("document.documentElement.scrollWidth")
        if width > 390:
            wide[url] = width
    assert wide == {}, f"pages wider than the screen: {wide}"


def test_abort_asks_first_and_cancel_changes_nothing(page, simfleet, operator, transactional_db):
    source = make_source(simfleet, require_approval=True)

    def awaiting():
        from controlplane.refresh import intents

        refresh = plan(source, operator, "v-confirm")
        return intents.start_policy_refresh(refresh, actor=actor_for(operator), enqueue=False)

    refresh = _elsewhere(awaiting)
    assert refresh.state == RefreshState.AWAITING_APPROVAL
    sign_in(page, operator.username, PASSWORD)
    page.goto(f"/refreshes/{refresh.pk}/")
    native = []
    page.on("dialog", lambda dialog: (native.append(dialog.message), dialog.dismiss()))

    # Our own dialog asks first, naming what the abort touches; Cancel changes nothing.
    page.click("#refresh-actions #abort-refresh")
    dialog = page.locator("dialog#dialog-abort")
    dialog.wait_for(state="visible")
    assert f"Abort policy refresh #{refresh.pk}?" in dialog.inner_text()
    dialog.locator("[data-dialog-close]").click()
    dialog.wait_for(state="hidden")
    page.wait_for_timeout(300)  # give a (wrongly) submitted form the time to land
    assert PolicyRefresh.objects.get(pk=refresh.pk).state == RefreshState.AWAITING_APPROVAL

    page.click("#refresh-actions #abort-refresh")
    with page.expect_navigation():
        dialog.locator("[data-dialog-submit]").click()
    assert PolicyRefresh.objects.get(pk=refresh.pk).state == RefreshState.ABORTED
    assert native == []  # no native confirm() on the way
    # Leave the page before the database is flushed: its htmx loads and live sockets would
    # otherwise still be reading tables the flush truncates (a deadlock at teardown).
    page.wait_for_load_state("networkidle")
    page.goto("about:blank")


def test_403_for_a_viewer_renders_inside_the_layout(page, viewer, transactional_db):
    sign_in(page, viewer.username, PASSWORD)
    response = page.goto("/admin-tools/tokens/")
    assert response.status == 403
    assert page.locator("#error-403 h1").inner_text() == "Not permitted"
    assert page.locator("nav.mainnav a", has_text="Gates").is_visible()
    assert page.evaluate("getComputedStyle(document.querySelector('.card')).borderRadius") == "8px"


#: Installed before any page script: lets the test cut every live socket and refuse new ones
#: until it says so, as a dropped network would.
CUT_SOCKETS = """
(() => {
  const Native = window.WebSocket;
  window.__sockets = [];
  window.__blocked = false;
  window.WebSocket = function (url, protocols) {
    const target = window.__blocked ? url.replace(/\\/ws\\//, "/ws-blocked/") : url;
    const ws = new Native(target, protocols);
    window.__sockets.push(ws);
    return ws;
  };
  window.WebSocket.prototype = Native.prototype;
  Object.assign(window.WebSocket, { CONNECTING: 0, OPEN: 1, CLOSING: 2, CLOSED: 3 });
  // A dropped network closes with 1006, the code on which htmx's ws extension reconnects;
  // a page cannot close with it, so the extension's handler is told so after a real close.
  window.__cut = () => {
    window.__blocked = true;
    window.__sockets.forEach((s) => {
      const onclose = s.onclose;
      s.onclose = null;
      s.close();
      if (onclose) onclose(new CloseEvent("close", { code: 1006, wasClean: false }));
    });
  };
  window.__restore = () => { window.__blocked = false; };
})();
"""


def test_connection_banner_says_live_reconnecting_then_stale(page, approver, transactional_db):
    source = Source.objects.create(
        name="sim",
        listener_url="http://127.0.0.1:9/",
        allowed_networks=["127.0.0.0/8"],
        last_success_at=timezone.now(),
    )
    Gate.objects.create(source=source, namespace="rl-a", state=GateState.OPEN)
    page.add_init_script(CUT_SOCKETS)
    sign_in(page, approver.username, PASSWORD)
    page.goto("/refreshes/gates/")
    banner = page.locator("#connection")
    assert banner.get_attribute("aria-live") == "polite"
    page.wait_for_selector("#connection[data-state=live]")
    assert banner.inner_text() == "Live"

    page.evaluate("window.__cut()")
    page.wait_for_selector("#connection[data-state=reconnecting]")
    assert banner.inner_text() == "Reconnecting…"
    page.wait_for_selector("#connection[data-state=stale]", timeout=15_000)
    assert banner.inner_text().startswith("Stale since ")
    assert len(banner.inner_text()) == len("Stale since HH:MM")

    page.evaluate("window.__restore()")
    page.wait_for_selector("#connection[data-state=live]", timeout=30_000)
    assert banner.inner_text() == "Live"
