"""A person reads on the fleet overview when each source's rollback was last proven, follows
the link to the drill, and runs a new drill from the source page."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connections
from django.template.defaultfilters import floatformat

from controlplane.fleet.models import Source
from controlplane.refresh.drills.actions import start_drill
from controlplane.refresh.drills.runner import record_refused
from controlplane.refresh.models import DrillOutcome, DrillRun
from tests.conftest import PASSWORD
from tests.fixtures.live_server import sign_in
from tests.integration.drills.helpers import actor_for, run_drill_inline, verified_twice
from tests.integration.refresh.helpers import fleet_config

pytestmark = pytest.mark.browser


def _elsewhere(fn):
    """Playwright keeps an event loop in this thread; the executor runs its own, so drive the
    fleet from another thread (as a Celery worker would)."""

    def run():
        try:
            return fn()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def test_overview_shows_each_sources_drill_status(page, operator, simfleet_factory):
    fleet = simfleet_factory(fleet_config(6))

    def setup():
        proven = verified_twice(fleet, operator, name="proven")
        drill = run_drill_inline(start_drill(proven, actor=actor_for(operator), enqueue=False))
        assert drill.outcome == DrillOutcome.SUCCEEDED, drill.reason
        failing = Source.objects.create(
            name="failing", listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
        )
        record_refused(failing, "no policy was verified before the current one")
        never = Source.objects.create(
            name="never", listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
        )
        return proven, drill, failing, never

    proven, drill, failing, never = _elsewhere(setup)

    sign_in(page, operator.username, PASSWORD)
    page.goto("/")
    status = page.locator(f"#drill-status-{proven.pk}")
    text = status.inner_text()
    assert "rollback last proven" in text and "ago" in text
    # Rounded as the page rounds (floatformat rounds half up; an f-string rounds 0.25 to 0.2).
    forward, back = (floatformat(s, 1) for s in (drill.forward_seconds, drill.back_seconds))
    assert f"forward {forward} s, back {back} s" in text
    failed_text = page.locator(f"#drill-status-{failing.pk}").inner_text()
    assert "last drill failed" in failed_text and "verified before the current one" in failed_text
    assert page.locator(f"#drill-status-{never.pk}").inner_text().strip() == "never proven"

    # The status links to the drill, which links to both refreshes with their durations.
    status.locator("a").click()
    page.wait_for_url(f"**/refreshes/drills/{drill.pk}/")
    assert page.locator("#drill-outcome").inner_text() == "succeeded"
    detail = page.locator("#drill").inner_text()
    assert f"policy refresh #{drill.forward_refresh_id}" in detail
    assert f"policy refresh #{drill.back_refresh_id}" in detail

    # From the source page, the button asks first and starts a new drill.
    page.goto(f"/sources/{proven.pk}/")
    assert page.locator("#drills tbody tr").count() == 1
    page.click("#run-drill")  # our own dialog asks first (no native confirm)
    assert "rollback drill" in page.locator("#confirm-dialog .confirm-question").inner_text()
    page.click("#confirm-dialog-ok")
    page.wait_for_url("**/refreshes/drills/*/")
    started = DrillRun.objects.filter(source=proven).exclude(pk=drill.pk).get()
    assert started.requested_by == operator
    assert page.locator("#drill-outcome").inner_text() in ("running", "succeeded", "failed")
