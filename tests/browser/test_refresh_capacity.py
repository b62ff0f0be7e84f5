"""A person watches a refresh's capacity chart fill in without reloading: every worker paused,
then back on the new version, with the time each namespace was gated."""

from __future__ import annotations

import os
import threading

import pytest
from django.db import connection

from controlplane.refresh import intents
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import RefreshState
from tests.conftest import PASSWORD
from tests.fixtures.live_server import sign_in
from tests.integration.refresh.helpers import actor_for, fleet_config, make_source, plan

pytestmark = pytest.mark.browser

WORKERS = 6


def test_the_capacity_chart_appears_and_fills_in_live(page, simfleet_factory, operator, viewer):
    fleet = simfleet_factory(fleet_config(WORKERS))
    source = make_source(fleet)
    refresh = plan(source, operator, "v2")
    intents.start_policy_refresh(refresh, actor=actor_for(operator), enqueue=False)

    sign_in(page, viewer.username, PASSWORD)
    page.goto(f"/refreshes/{refresh.pk}/")
    page.wait_for_selector(".live-dot.connected")
    # Started, nothing paused yet: every worker still runs its previous version.
    assert page.locator("#capacity-peak").inner_text().startswith(f"0 of {WORKERS}")
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads

    def run() -> None:
        try:
            execute_refresh(refresh.pk)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        page.wait_for_selector("#refresh-state[data-state=succeeded]", timeout=60_000)
    finally:
        thread.join(60)
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason

    # The succeeded head carries the finished chart, swapped in over the websocket.
    page.wait_for_selector(f"#refresh-capacity[data-peak-unavailable='{WORKERS}']")
    assert page.evaluate("window.__sameDocument") is True
    # Measured inside the page in one go: a later push may swap the section between a locator
    # resolving and measuring it (a detached element has no box).
    page.wait_for_function(
        """() => {
            const svg = document.querySelector('#refresh-capacity svg.chart-steps');
            if (!svg) return false;
            const box = svg.getBoundingClientRect();
            return box.width > 300 && box.height > 100;
        }"""
    )
    chart = page.locator("#refresh-capacity svg.chart-steps")
    assert chart.locator("path.chart-area.chart-paused").count() == 1
    assert chart.locator("path.chart-step.chart-admitted").count() == 1
    legend = chart.locator("g.chart-legend text").all_text_contents()
    assert legend == ["previous running", "v2 running", "paused", "admitted by the gate"]
    assert page.locator("#capacity-peak").inner_text().startswith(f"{WORKERS} of {WORKERS}")
    assert page.locator("#capacity-lowest-running").inner_text().startswith("0%")
    gated = page.locator("#capacity-gated tbody tr")
    assert gated.count() == len(refresh.namespaces)
    assert page.locator("#capacity-longest tbody tr").count() == WORKERS
    if shots := os.environ.get("CAPACITY_SCREENSHOT"):
        page.locator("#refresh-capacity").screenshot(path=shots)
