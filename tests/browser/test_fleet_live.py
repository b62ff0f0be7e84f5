"""A person watches a source page while the simulated fleet changes underneath it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connections

from controlplane.audit.recorder import Actor
from controlplane.fleet import services
from controlplane.fleet.discovery import run_discovery
from controlplane.fleet.models import DiscoveryTrigger, Worker
from controlplane.simfleet import SimFleetControl
from tests.conftest import PASSWORD
from tests.fixtures.live_server import sign_in

pytestmark = pytest.mark.browser


def _refresh(source_id: int) -> None:
    """Refresh on another thread: Playwright's sync API keeps an event loop in this one, and
    `publish` (sync-to-async) must run where no loop is running — as in a Celery worker."""

    def run() -> None:
        try:
            run_discovery(source_id, trigger=DiscoveryTrigger.MANUAL)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        pool.submit(run).result()


def test_source_table_updates_live_without_reloading(page, viewer, simfleet):
    source = services.create_source(
        actor=Actor.system("test"),
        name="sim",
        listener_url=simfleet.listener_url,
        allowed_networks=["127.0.0.0/8"],
        expected_prefix="rl",
    )
    _refresh(source.pk)
    control = SimFleetControl(simfleet.control_url)
    leaving, bumped = control.workers()[:2]
    leaving_row = Worker.objects.get(instance_id=str(leaving["instance_id"]))
    bumped_row = Worker.objects.get(instance_id=str(bumped["instance_id"]))

    sign_in(page, viewer.username, PASSWORD)
    page.goto(f"/sources/{source.pk}/")
    page.wait_for_selector(".live-dot.connected")  # the websocket is up
    page.evaluate("window.__notReloaded = true")
    assert page.locator(f"#worker-{leaving_row.pk} .badge.live").count() == 1

    # Change the fleet through the simulator's control API, then let discovery see it.
    control.remove_worker(leaving["instance_id"])
    control.set_version(bumped["instance_id"], "step-99")
    _refresh(source.pk)

    page.locator(f"#worker-{leaving_row.pk} .badge.gone").wait_for()
    page.locator(f"#worker-{bumped_row.pk}", has_text="step-99").wait_for()
    page.locator("#timeline", has_text="Left").wait_for()
    assert page.evaluate("window.__notReloaded") is True  # same document: no reload
    control.close()
