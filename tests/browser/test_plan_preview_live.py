"""A person reads a plan's summary in the browser and discards it instead of starting it."""

from __future__ import annotations

import pytest

from controlplane.accounts.roles import Role
from controlplane.accounts.services import create_user_with_role
from controlplane.audit.models import AuditEvent
from controlplane.refresh.models import PolicyRefresh, RefreshState
from tests.conftest import PASSWORD
from tests.fixtures.live_server import sign_in
from tests.integration.refresh.helpers import fleet_config, make_source, sync_workers


@pytest.fixture
def fleet_source(simfleet_factory, transactional_db):
    source = make_source(simfleet_factory(fleet_config(4)))
    sync_workers(source)
    return source


def test_plan_summary_then_discard(page, fleet_source):
    create_user_with_role("op", Role.OPERATOR, PASSWORD, validate=False)
    sign_in(page, "op", PASSWORD)

    page.goto("/refreshes/new/")
    page.select_option("#id_source", fleet_source.name)
    page.fill("#id_weight_version", "v9")
    page.fill("#id_model_path", "/ckpt/v9")
    page.click("form.plan-form button[type=submit]")
    page.wait_for_url("**/refreshes/*/", timeout=30_000)

    headline = page.locator("#plan-headline")
    assert "4 of 4 workers ready" in headline.inner_text()
    assert "no history yet" in page.locator("#plan-expected").inner_text()
    assert "4 workers" in page.locator("#plan-pauses").inner_text()
    # The buttons sit right under the summary, inside the first screen.
    confirm = page.locator("#confirm-refresh").bounding_box()
    assert confirm is not None and confirm["y"] < page.viewport_size["height"]
    # Calls are collapsed until asked for; opened, the body is JSON.
    first_calls = page.locator("details.worker-calls").first
    assert not first_calls.locator("pre.json").first.is_visible()
    first_calls.locator("summary").click()
    bodies = first_calls.locator("pre.json").all_inner_texts()
    assert any('"model_path": "/ckpt/v9"' in body for body in bodies)

    page.click("#discard-refresh")  # our own dialog asks first
    page.click("dialog#dialog-discard [data-dialog-submit]")
    page.wait_for_selector("text=Plan discarded; nothing was started.")
    refresh = PolicyRefresh.objects.get(source=fleet_source)
    assert refresh.state == RefreshState.ABORTED and refresh.started_at is None
    assert AuditEvent.objects.filter(
        action="policy_refresh.discarded", target_id=str(refresh.pk)
    ).exists()
    page.goto("/refreshes/?state=discarded")
    row = page.locator(f"#refresh-row-{refresh.pk}")
    assert row.count() == 1 and "discarded" in row.inner_text()
