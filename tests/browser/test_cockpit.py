"""The cockpit on top of a refresh page: above the fold at 1440x900 in every state we can
produce, no horizontal scroll at 1440 and 390 px, dialogs of our own that say what an action
touches, and a flash message that goes once the refresh moves on."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connections

from controlplane.refresh import intents
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import PolicyRefresh, RefreshState
from controlplane.simfleet import Fault
from tests.conftest import PASSWORD
from tests.fixtures.live_server import sign_in
from tests.integration.refresh.helpers import (
    actor_for,
    fleet_config,
    make_source,
    plan,
    run_inline,
    sync_workers,
    wait_for,
)

pytestmark = pytest.mark.browser

WIDE = {"width": 1440, "height": 900}
NARROW = {"width": 390, "height": 844}


def _elsewhere(fn):
    """Run on another thread: Playwright's sync API keeps an event loop in this one."""

    def run():
        try:
            return fn()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


@pytest.fixture
def fleet(simfleet_factory, transactional_db):
    return simfleet_factory(fleet_config(6))


@pytest.fixture
def source(fleet):
    source = make_source(fleet)
    sync_workers(source)
    return source


def keys_in(fleet, namespace):
    return [w["key"] for w in fleet.workers() if w["namespace"] == namespace]


def _no_horizontal_scroll(page) -> bool:
    return page.evaluate(
        "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
    )


def _header_fits(page, url: str) -> None:
    page.set_viewport_size(WIDE)
    page.goto(url)
    # The live stream may swap the cockpit in once its socket connects: measure the one shown.
    page.wait_for_selector("#cockpit #refresh-state", state="visible")
    page.locator("#cockpit").wait_for(state="visible")
    box = page.evaluate(
        "(() => { const r = document.getElementById('cockpit').getBoundingClientRect();"
        " return r.height ? {y: r.top + window.scrollY, height: r.height} : null; })()"
    )
    assert box is not None and box["y"] + box["height"] < WIDE["height"], (url, box)
    # The state and the actions are in it.
    assert page.locator("#cockpit #refresh-actions").count() == 1
    assert _no_horizontal_scroll(page), url
    page.set_viewport_size(NARROW)
    page.goto(url)
    assert _no_horizontal_scroll(page), url


MANUAL_CANARY = {
    "kind": "canary",
    "canary": {"size": 2, "evaluation": "manual", "timeout_seconds": 600},
    "max_unavailable": 2,
}


def test_the_cockpit_is_above_the_fold_in_every_state(page, fleet, source, admin_user):
    admin = actor_for(admin_user)
    sign_in(page, admin_user.username, PASSWORD)

    planned = _elsewhere(lambda: plan(source, admin_user, "v1"))
    _header_fits(page, f"/refreshes/{planned.pk}/")
    page.wait_for_selector("#cockpit #confirm-refresh", state="visible")

    def start_slow():
        for key in keys_in(fleet, "rl-a"):
            fleet.inject(key, "update_weights_from_disk", Fault.latency(4.0))
        intents.start_policy_refresh(planned, actor=admin, enqueue=False)

    _elsewhere(start_slow)
    pool = ThreadPoolExecutor(1)
    running = pool.submit(lambda: (execute_refresh(planned.pk), connections.close_all()))
    wait_for(
        lambda: PolicyRefresh.objects.filter(pk=planned.pk, state=RefreshState.UPDATING).exists()
    )
    _header_fits(page, f"/refreshes/{planned.pk}/")
    assert page.locator("#cockpit #refresh-state").get_attribute("data-state") == "updating"
    page.wait_for_selector("#cockpit #abort-refresh", state="visible")
    running.result(timeout=60)
    pool.shutdown()
    _elsewhere(lambda: [fleet.clear_faults(k) for k in keys_in(fleet, "rl-a")])
    assert PolicyRefresh.objects.get(pk=planned.pk).state == RefreshState.SUCCEEDED
    _header_fits(page, f"/refreshes/{planned.pk}/")
    # Current → target per namespace, and what trainers see.
    row = page.locator("#ns-gate-1")
    assert "v1" in row.locator(".ns-target").inner_text()
    assert "open" in row.inner_text()

    bad = keys_in(fleet, "rl-b")[0]

    def hold():
        fleet.inject(bad, "update_weights_from_disk", Fault.error("disk full"))
        return run_inline(source, admin_user, "v2")

    held = _elsewhere(hold)
    assert held.state == RefreshState.HELD
    _header_fits(page, f"/refreshes/{held.pk}/")
    page.screenshot(path="/tmp/cockpit-held-narrow.png")
    page.set_viewport_size(WIDE)
    page.goto(f"/refreshes/{held.pk}/")
    page.wait_for_selector("#cockpit #retry-refresh")
    page.screenshot(path="/tmp/cockpit-held.png")
    page.wait_for_selector("#cockpit #held-reason", state="visible")
    page.wait_for_selector("#cockpit #retry-refresh", state="visible")

    def abort():
        fleet.clear_faults(bad)
        intents.abort_policy_refresh(held, actor=admin, resume_engines=True)
        execute_refresh(held.pk)

    _elsewhere(abort)
    assert PolicyRefresh.objects.get(pk=held.pk).state == RefreshState.ABORTED
    _header_fits(page, f"/refreshes/{held.pk}/")
    # After an abort the page offers the next steps that apply.
    page.set_viewport_size(WIDE)
    page.goto(f"/refreshes/{held.pk}/")
    page.wait_for_selector("#next-plan", state="visible")
    page.wait_for_selector("#next-rollback", state="visible")

    canary = _elsewhere(lambda: run_inline(source, admin_user, "v3", strategy=MANUAL_CANARY))
    assert canary.state == RefreshState.CANARY_REVIEW, canary.held_reason
    _header_fits(page, f"/refreshes/{canary.pk}/")
    page.wait_for_selector("#cockpit #approve-canary", state="visible")

    # The other pages the cockpit links to fit too, wide and narrow.
    for url in (
        "/refreshes/new/",
        "/refreshes/gates/",
        f"/refreshes/sources/{source.pk}/rollback/",
    ):
        for size in (WIDE, NARROW):
            page.set_viewport_size(size)
            page.goto(url)
            assert _no_horizontal_scroll(page), (url, size)
    page.goto("about:blank")


def test_an_aborting_refresh_shows_abort_disabled(client, fleet, source, operator):
    """`aborting` (the executor has not confirmed the abort yet): the cockpit says so and the
    Abort button is disabled, not offered again."""
    refresh = plan(source, operator, "v1")
    intents.start_policy_refresh(refresh, actor=actor_for(operator), enqueue=False)
    PolicyRefresh.objects.filter(pk=refresh.pk).update(state="aborting")
    client.force_login(operator)
    html = client.get(f"/refreshes/{refresh.pk}/").content.decode()
    assert 'data-state="aborting">aborting…</span>' in html
    assert '<button class="danger" id="abort-refresh" disabled>aborting…</button>' in html
    assert 'data-dialog="dialog-abort"' not in html
