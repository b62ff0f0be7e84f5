"""A person plans and confirms a refresh and watches the grid turn green, without reloading."""

from __future__ import annotations

import pytest

from controlplane.accounts.roles import Role
from controlplane.accounts.services import create_user_with_role
from controlplane.refresh.models import PolicyRefresh, RefreshState
from controlplane.refresh.tasks import execute_policy_refresh
from tests.conftest import PASSWORD
from tests.fixtures.live_server import sign_in
from tests.integration.refresh.helpers import fleet_config, make_source, sync_workers


@pytest.fixture
def fleet_source(simfleet_factory, transactional_db):
    fleet = simfleet_factory(fleet_config(6))
    # Slow updates, so the page is visibly mid-refresh before the grid turns green.
    from controlplane.simfleet import Fault

    for worker in fleet.workers():
        fleet.inject(worker["key"], "update_weights_from_disk", Fault.latency(0.5))
    source = make_source(fleet)
    sync_workers(source)
    return source


def test_start_a_refresh_and_watch_the_grid_turn_green(page, fleet_source, celery_worker):
    create_user_with_role("op", Role.OPERATOR, PASSWORD, validate=False)
    sign_in(page, "op", PASSWORD)

    page.goto("/refreshes/new/")
    page.select_option("#id_source", fleet_source.name)
    page.fill("#id_weight_version", "v7")
    page.fill("#id_model_path", "/ckpt/v7")
    page.click("form.plan-form button[type=submit]")
    page.wait_for_url("**/refreshes/*/", timeout=30_000)
    page.wait_for_selector("#confirm-refresh")
    assert "engine/update_weights_from_disk" in page.content()

    page.click("#confirm-refresh")
    page.wait_for_selector(".live-dot.connected")
    # The server process was forked before this test's Celery queue existed, so its enqueue
    # went to the default queue; hand the (idempotent, lease-claimed) task to our worker.
    refresh = PolicyRefresh.objects.get(source=fleet_source)
    assert refresh.state == RefreshState.GATING
    execute_policy_refresh.delay(refresh.pk)
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads
    page.wait_for_selector("#refresh-state[data-state=succeeded]", timeout=60_000)

    assert page.evaluate("window.__sameDocument") is True
    assert page.locator("td.cell.ok").count() == 6 * 4
    assert page.locator("td.cell.failed").count() == 0
