"""The canary analysis report, seen in Chromium: a drifted checkpoint judged on the simulated
lineage, then the report page opened as a viewer. It shows the outcome and score, each
metric's verdict with both cohorts' per-prompt values drawn, the prompts that moved most with
token ids and both replies, and the watch panel; the page logs no console error."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connections

from controlplane.refresh.intents.analysis import run_canary_analysis
from controlplane.refresh.models import RefreshState
from tests.conftest import PASSWORD
from tests.fixtures.live_server import sign_in
from tests.integration.canary_analysis.helpers import canary, lineage_fleet_config, save
from tests.integration.refresh.helpers import make_source, run_inline

pytestmark = pytest.mark.browser


def off_the_page_loop(fn):
    """Run `fn` in a thread of its own: Playwright's loop runs in this one, and the executor
    and the analysis run loops of their own."""

    def run():
        try:
            return fn()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def test_the_report_shows_what_the_judge_saw_and_decided(
    page, simfleet_factory, operator, admin_user, viewer
):
    fleet = simfleet_factory(lineage_fleet_config(6))

    def judged():
        source = make_source(fleet)
        assert run_inline(source, operator, "v1").state == RefreshState.SUCCEEDED
        save(source, admin_user)
        fleet.set_broken("v2", "drift")
        refresh = run_inline(source, operator, "v2", strategy=canary())
        assert refresh.state == RefreshState.CANARY_REVIEW, refresh.held_reason
        run_canary_analysis(refresh.pk)
        return refresh

    refresh = off_the_page_loop(judged)

    problems: list[str] = []
    page.on("console", lambda m: m.type == "error" and problems.append(m.text))
    page.on("pageerror", lambda e: problems.append(str(e)))
    sign_in(page, viewer.username, PASSWORD)
    page.goto(f"/refreshes/{refresh.pk}/")
    page.click("#canary-analysis-link")
    page.wait_for_url(f"**/refreshes/{refresh.pk}/analysis/")

    assert page.locator("#analysis-outcome").inner_text() == "fail"
    assert float(page.locator("#analysis-score").inner_text()) < 75
    assert "ref_logprob" in page.locator("#analysis-summary").inner_text()
    rows = page.locator("#analysis-metrics tbody tr")
    assert rows.count() == 10
    drift = page.locator("#metric-ref_logprob")
    assert "fail" in drift.inner_text() and "critical" in drift.inner_text()
    # Both cohorts drawn: one dot per prompt and cohort (24 prompts each), two medians.
    assert drift.locator("svg circle").count() == 48
    assert drift.locator("svg line.chart-median").count() == 2
    moved = page.locator("#analysis-moved tbody tr")
    assert moved.count() == 10
    assert "log-prob shift" in moved.first.inner_text()
    assert page.locator("#watch-none").is_visible()
    assert problems == []
