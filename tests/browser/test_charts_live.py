"""Charts follow the fleet without a reload: the overview's version chart and the source
page's fleet map after a discovery, and the refresh page's phase timeline (with its per-worker
rows) while a refresh runs."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connections

from controlplane.accounts.roles import Role
from controlplane.accounts.services import create_user_with_role
from controlplane.audit.recorder import Actor
from controlplane.fleet import services
from controlplane.fleet.discovery import run_discovery
from controlplane.fleet.models import DiscoveryTrigger
from controlplane.refresh import intents
from controlplane.refresh.models import RefreshState
from controlplane.refresh.tasks import execute_policy_refresh
from controlplane.simfleet import Fault, SimFleetControl
from tests.conftest import PASSWORD
from tests.fixtures.live_server import sign_in
from tests.integration.refresh.helpers import fleet_config, make_source, plan

pytestmark = pytest.mark.browser


def _elsewhere(fn):
    """On another thread: Playwright keeps an event loop in this one, and `publish` must run
    where none is running, as in a Celery worker."""

    def run():
        try:
            return fn()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def _discover(source_id: int) -> None:
    _elsewhere(lambda: run_discovery(source_id, trigger=DiscoveryTrigger.MANUAL))


def test_version_chart_and_fleet_map_change_after_discovery(page, viewer, simfleet):
    source = services.create_source(
        actor=Actor.system("test"),
        name="sim",
        listener_url=simfleet.listener_url,
        allowed_networks=["127.0.0.0/8"],
        expected_prefix="rl",
    )
    _discover(source.pk)
    control = SimFleetControl(simfleet.control_url)
    bumped = control.workers()[0]

    sign_in(page, viewer.username, PASSWORD)
    page.goto("/")
    page.wait_for_selector(".live-dot.connected")
    page.evaluate("window.__sameDocument = true")
    chart = page.locator("#version-chart")
    assert "step-4711" not in chart.inner_html()

    control.set_version(bumped["instance_id"], "step-4711")
    _discover(source.pk)
    page.locator("#version-chart title", has_text="step-4711").first.wait_for(state="attached")
    assert page.evaluate("window.__sameDocument") is True

    page.goto(f"/sources/{source.pk}/")
    page.wait_for_selector(".live-dot.connected")
    page.locator("#fleet-map-cells [data-fleet-map][data-drawn]").wait_for(state="attached")
    page.evaluate("window.__sameDocument = true")
    assert "step-4712" not in page.locator("#fleet-map-cells").inner_html()

    control.set_version(bumped["instance_id"], "step-4712")
    _discover(source.pk)
    # The map re-read after the push, and drawn: the new version is in its payload and legend.
    page.locator('#fleet-map-cells [data-fleet-map*="step-4712"][data-drawn]').wait_for(
        state="attached"
    )
    page.locator("#fleet-map-cells .fleet-map-legend li", has_text="step-4712").wait_for()
    page.locator("#version-chart title", has_text="step-4712").first.wait_for(state="attached")
    assert page.evaluate("window.__sameDocument") is True
    control.close()


def _bars(page) -> int:
    return page.locator("#refresh-timeline svg.chart-gantt").first.locator("rect").count()


def test_phase_timeline_grows_live_while_the_refresh_runs(
    page, simfleet_factory, transactional_db, celery_worker
):
    fleet = simfleet_factory(fleet_config(4))
    for worker in fleet.workers():  # slow enough to watch the steps arrive one by one
        fleet.inject(worker["key"], "update_weights_from_disk", Fault.latency(0.5))
    source = _elsewhere(lambda: make_source(fleet))
    operator = create_user_with_role("op", Role.OPERATOR, PASSWORD, validate=False)
    refresh = _elsewhere(lambda: plan(source, operator, "v7"))

    sign_in(page, "op", PASSWORD)
    _elsewhere(
        lambda: intents.start_policy_refresh(refresh, actor=Actor.for_user(operator), enqueue=False)
    )
    page.goto(f"/refreshes/{refresh.pk}/")
    page.wait_for_selector(".live-dot.connected")
    page.evaluate("window.__sameDocument = true")
    assert _bars(page) == 0
    assert page.locator("#worker-timeline").count() == 0

    execute_policy_refresh.delay(refresh.pk)
    # Bars arrive while it runs (the update step is still going), then all of them.
    page.wait_for_function(
        "() => document.querySelector('#refresh-state').dataset.state === 'updating'"
        " && document.querySelectorAll('#refresh-timeline svg.chart-gantt')[0]"
        ".querySelectorAll('rect').length >= 3",
        timeout=60_000,
    )
    page.wait_for_selector("#refresh-state[data-state=succeeded]", timeout=60_000)
    page.wait_for_function(
        "() => document.querySelectorAll('#refresh-timeline svg.chart-gantt')[0]"
        ".querySelectorAll('rect').length === 8"
    )
    # The per-worker rows are fetched by the pushed head: one lane per worker.
    page.locator("#worker-timeline[data-rows='4']").wait_for()
    assert page.evaluate("window.__sameDocument") is True
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.SUCCEEDED
