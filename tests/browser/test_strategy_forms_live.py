"""A person chooses a refresh strategy in the browser: on the plan form (a canary, judged by a
person), with a field error next to the field it is about, and as a source's default, which a
plan with the blank choice then gets."""

from __future__ import annotations

import pytest

from controlplane.accounts.roles import Role
from controlplane.accounts.services import create_user_with_role
from controlplane.audit.models import AuditEvent
from controlplane.fleet.models import Source
from controlplane.refresh.models import PolicyRefresh
from tests.conftest import PASSWORD
from tests.fixtures.live_server import sign_in
from tests.integration.refresh.helpers import fleet_config, make_source, sync_workers

pytestmark = pytest.mark.browser


@pytest.fixture
def fleet_source(simfleet_factory, transactional_db):
    source = make_source(simfleet_factory(fleet_config(6)))
    sync_workers(source)
    return source


def fill_plan(page, source, version: str) -> None:
    page.goto("/refreshes/new/")
    page.select_option("#id_source", source.name)
    page.fill("#id_weight_version", version)
    page.fill("#id_model_path", f"/ckpt/{version}")


def test_a_canary_chosen_on_the_plan_form_is_planned_and_shown(page, fleet_source):
    create_user_with_role("op", Role.OPERATOR, PASSWORD, validate=False)
    sign_in(page, "op", PASSWORD)

    # Waves without their size: the error sits next to the field, and nothing is planned.
    fill_plan(page, fleet_source, "v8")
    page.select_option("#id_strategy_kind", "waves")
    page.click("form.plan-form button[type=submit]")
    field = page.locator("#strategy-fields")
    assert "waves need max_unavailable" in field.inner_text()
    assert not PolicyRefresh.objects.exists()

    fill_plan(page, fleet_source, "v9")
    page.select_option("#id_strategy_kind", "canary")
    page.fill("#id_canary_size", "1")
    page.select_option("#id_canary_evaluation", "manual")
    page.fill("#id_max_unavailable", "1")
    page.fill("#id_pause_after", "2")
    page.click("form.plan-form button[type=submit]")
    page.wait_for_url("**/refreshes/*/", timeout=30_000)

    refresh = PolicyRefresh.objects.get(source=fleet_source)
    assert refresh.strategy["kind"] == "canary"
    assert refresh.strategy["canary"]["evaluation"] == "manual"
    assert refresh.strategy["pause_after"] == [2]
    summary = page.locator("#plan-strategy").inner_text()
    assert "canary of 1 worker(s) approved by a person" in summary
    assert "waits after wave 2" in page.locator("#refresh-strategy").inner_text()


def test_a_source_default_strategy_is_set_on_its_page_and_used_by_plans(page, fleet_source):
    create_user_with_role("adm", Role.ADMIN, PASSWORD, validate=False)
    sign_in(page, "adm", PASSWORD)

    page.goto(f"/sources/{fleet_source.pk}/")
    assert page.locator("#source-strategy").inner_text().startswith("all at once")
    page.click("#change-source-strategy")
    page.select_option("#id_strategy_kind", "waves")
    page.fill("#id_max_unavailable", "50%")
    page.fill("#id_max_failed", "1")
    page.click("form.plan-form button[type=submit]")
    page.wait_for_url(f"**/sources/{fleet_source.pk}/")
    shown = page.locator("#source-strategy").inner_text()
    assert "waves of at most 50% per namespace" in shown
    fleet_source = Source.objects.get(pk=fleet_source.pk)
    assert fleet_source.default_strategy == {
        "kind": "waves",
        "max_unavailable": "50%",
        "max_failed": 1,
        "admit_as_verified": False,
    }
    audit = AuditEvent.objects.filter(action="source.updated", target_id=str(fleet_source.pk))
    assert audit.count() == 1

    fill_plan(page, fleet_source, "v10")  # the blank choice: the source's default
    page.click("form.plan-form button[type=submit]")
    page.wait_for_url("**/refreshes/*/", timeout=30_000)
    refresh = PolicyRefresh.objects.get(source=fleet_source)
    assert refresh.strategy == fleet_source.default_strategy
    assert "waves of at most 50% per namespace" in page.locator("#refresh-strategy").inner_text()
