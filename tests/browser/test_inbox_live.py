"""An approver sees a refresh awaiting their approval as a badge in the top bar within 2 s of
its start, without reloading; approving it from the inbox empties the badge on other tabs.
Real Daphne, Channels over Redis, and the intents the operator's page runs."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connections

from controlplane.refresh import intents
from controlplane.refresh.models import PolicyRefresh, RefreshState
from tests.conftest import PASSWORD
from tests.fixtures.live_server import sign_in
from tests.integration.refresh.helpers import actor_for, make_source, plan

pytestmark = pytest.mark.browser


def _elsewhere(fn):
    """Run `fn` on another thread (Playwright keeps an event loop in this one, and `publish`
    must run where no loop is running — as in a Celery worker)."""

    def run():
        try:
            return fn()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def _badge_count(page) -> str:
    return page.evaluate(
        "(() => { const b = document.getElementById('inbox-badge');"
        " return b && !b.hidden ? b.textContent : ''; })()"
    )


def test_approver_sees_a_pending_approval_within_2_s_without_reloading(
    page, _browser, live_server_url, simfleet, operator, approver
):
    source = make_source(simfleet, require_approval=True)
    planned = _elsewhere(lambda: plan(source, operator, "v-inbox"))

    sign_in(page, approver.username, PASSWORD)
    page.goto("/")
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads
    # The socket's first frame is the current count: nothing yet.
    page.wait_for_selector("#inbox-badge[data-count='0']", state="attached")
    assert _badge_count(page) == ""

    # The operator starts the plan; the source requires approval.
    refresh = _elsewhere(
        lambda: intents.start_policy_refresh(planned, actor=actor_for(operator), enqueue=False)
    )
    assert refresh.state == RefreshState.AWAITING_APPROVAL
    # Polled by Playwright with a deadline (the page's CSP forbids evaluated predicates).
    page.wait_for_selector("#inbox-badge[data-count='1']", state="visible", timeout=2_000)
    # Timed from the moment the refresh entered the state (in the start's transaction), so
    # the rest of that transaction, the commit and the push all count.
    assert time.time() - refresh.state_changed_at.timestamp() < 2.0
    assert _badge_count(page) == "1"
    assert page.evaluate("window.__sameDocument") is True
    assert "1 awaiting your approval" in page.get_attribute("a.inbox-link", "aria-label")

    # The requester has no badge (operators may not approve), whatever is pending.
    other = _browser.new_context(base_url=live_server_url)
    try:
        operator_page = other.new_page()
        sign_in(operator_page, operator.username, PASSWORD)
        operator_page.goto("/refreshes/")
        assert operator_page.locator("#inbox-badge").count() == 0
        assert operator_page.locator(f"#refresh-row-{refresh.pk} .awaits-me-cue").count() == 0
    finally:
        other.close()

    # A second tab approves from the inbox page; the first tab's badge empties by itself.
    second = page.context.new_page()
    second.goto("/refreshes/inbox/")
    with second.expect_navigation():
        second.click(f"#inbox-{refresh.pk} button.primary")
    assert PolicyRefresh.objects.get(pk=refresh.pk).approved_by_id == approver.pk
    page.wait_for_selector("#inbox-badge[data-count='0'][hidden]", state="attached", timeout=2_000)
    assert page.evaluate("window.__sameDocument") is True
    for p in (second, page):
        p.wait_for_load_state("networkidle")
        p.goto("about:blank")


def test_the_refresh_list_rows_follow_state_changes_live(page, simfleet, operator, approver):
    source = make_source(simfleet, require_approval=True)
    planned = _elsewhere(lambda: plan(source, operator, "v-list"))
    sign_in(page, approver.username, PASSWORD)
    page.goto("/refreshes/")
    page.wait_for_selector(".refresh-list[data-live=open]")
    page.evaluate("window.__sameDocument = true")
    row = page.locator(f"#refresh-row-{planned.pk}")
    assert row.get_attribute("data-state") == "planned"

    _elsewhere(
        lambda: intents.start_policy_refresh(planned, actor=actor_for(operator), enqueue=False)
    )
    page.wait_for_selector(f"#refresh-row-{planned.pk}[data-state=awaiting_approval].awaits-me")
    assert "awaiting your approval" in row.inner_text()

    def reject():
        intents.reject_policy_refresh(
            PolicyRefresh.objects.get(pk=planned.pk), actor=actor_for(approver), reason="no"
        )

    _elsewhere(reject)
    page.wait_for_selector(f"#refresh-row-{planned.pk}[data-state=rejected]")
    assert "awaits-me" not in (row.get_attribute("class") or "")
    assert page.evaluate("window.__sameDocument") is True
    page.goto("about:blank")
