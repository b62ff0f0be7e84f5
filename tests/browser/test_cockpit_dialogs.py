"""Dialogs of our own on the refresh and gates pages: each names the version, namespaces,
workers and gates it touches and what trainers see; no native confirm(). And a flash message
about a refresh goes away once the live page shows the refresh in another state."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connections

from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import Gate, PolicyRefresh, RefreshState
from controlplane.simfleet import Fault
from tests.conftest import PASSWORD
from tests.fixtures.live_server import sign_in
from tests.integration.refresh.helpers import fleet_config, make_source, run_inline, sync_workers

pytestmark = pytest.mark.browser


def _elsewhere(fn):
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
def held(fleet, admin_user):
    def produce():
        source = make_source(fleet)
        sync_workers(source)
        assert run_inline(source, admin_user, "v1").state == RefreshState.SUCCEEDED
        bad = next(w["key"] for w in fleet.workers() if w["namespace"] == "rl-b")
        fleet.inject(bad, "update_weights_from_disk", Fault.error("disk full"))
        refresh = run_inline(source, admin_user, "v2")
        assert refresh.state == RefreshState.HELD
        fleet.clear_faults(bad)
        return refresh

    return _elsewhere(produce)


def test_dangerous_actions_open_our_dialog_with_their_consequences(page, held, admin_user):
    native = []
    page.on("dialog", lambda dialog: (native.append(dialog.message), dialog.dismiss()))
    sign_in(page, admin_user.username, PASSWORD)
    page.goto(f"/refreshes/{held.pk}/")
    page.wait_for_selector(".live-dot.connected")
    page.wait_for_load_state("networkidle")

    page.click("#cockpit #abort-refresh")
    dialog = page.locator("dialog#dialog-abort")
    dialog.wait_for(state="visible")
    assert f"Abort policy refresh #{held.pk}?" in dialog.locator("h2").inner_text()
    assert "v2" in dialog.locator(".consequence-version").inner_text()
    assert dialog.locator(".consequence-namespaces").inner_text() == "rl-a, rl-b, rl-c"
    assert "6 planned workers" in dialog.locator(".consequence-workers").inner_text()
    assert "6 workers paused now" in dialog.locator(".consequence-workers").inner_text()
    assert "closed now: rl-a, rl-b, rl-c" in dialog.locator(".consequence-gates").inner_text()
    assert "stay closed" in dialog.locator(".consequence-after").inner_text()
    page.keyboard.press("Escape")
    dialog.wait_for(state="hidden")

    page.click("#cockpit [data-dialog=dialog-force_reopen-rl-b]")
    force = page.locator("dialog#dialog-force_reopen-rl-b")
    force.wait_for(state="visible")
    assert "Force-reopen rl-b without verification?" in force.inner_text()
    assert "open (forced)" in force.locator(".consequence-after").inner_text()
    # The reason is asked inside the dialog: without it, nothing is sent.
    force.locator("[data-dialog-submit]").click()
    page.wait_for_timeout(300)
    assert force.is_visible()
    assert Gate.objects.get(source=held.source, namespace="rl-b").active_refresh_id == held.pk
    force.locator("[data-dialog-close]").click()

    page.click("#cockpit #end-refresh")
    end = page.locator("dialog#dialog-end")
    end.wait_for(state="visible")
    assert "without calling any worker" in end.locator("h2").inner_text()
    end.locator("[data-dialog-close]").click()

    # The Gates page: the force-reopen form lives in a dialog naming the gate.
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto("/refreshes/gates/")
    page.wait_for_selector(".live-dot.connected")
    page.wait_for_load_state("networkidle")  # the streamed rows fetch their forms
    gate = Gate.objects.get(source=held.source, namespace="rl-a")
    page.click(f"#gate-actions-{gate.pk} [data-dialog]")
    gate_dialog = page.locator(f"dialog#dialog-force_reopen_gate-{gate.pk}")
    gate_dialog.wait_for(state="visible")
    assert "sim/rl-a" in gate_dialog.locator("h2").inner_text()
    assert f"policy refresh #{held.pk} lets go of rl-a" in gate_dialog.inner_text()
    gate_dialog.locator("[data-dialog-close]").click()
    assert page.evaluate(
        "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
    )
    assert native == []
    page.goto("about:blank")


def test_a_flash_message_goes_once_the_refresh_moves_on(page, held, admin_user):
    sign_in(page, admin_user.username, PASSWORD)
    page.goto(f"/refreshes/{held.pk}/")
    page.wait_for_selector(".live-dot.connected")
    # Retry: the page comes back with "retrying" as a flash, the refresh not yet run.
    with page.expect_navigation():
        page.click("#cockpit #retry-refresh")
    page.wait_for_selector(".messages")
    page.wait_for_selector(".live-dot.connected")
    assert PolicyRefresh.objects.get(pk=held.pk).state != RefreshState.HELD
    # The retry runs (the fault is gone) and the live page follows: the message is stale.
    _elsewhere(lambda: execute_refresh(held.pk))
    page.wait_for_selector("#refresh-state[data-state=succeeded]", timeout=30_000)
    page.wait_for_selector(".messages", state="detached")
    page.goto("about:blank")
