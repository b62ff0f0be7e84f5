"""Roll back through a plan page: a person picks an older verified version from the source's
revision history, a namespace an approver force-reopened stays out unless ticked, and nothing
starts until the plan is confirmed."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connections

from controlplane.refresh import intents
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import Gate, GateState, PolicyRefresh, RefreshState
from controlplane.simfleet import Fault
from tests.conftest import PASSWORD
from tests.fixtures.live_server import sign_in
from tests.integration.refresh.helpers import (
    actor_for,
    fleet_config,
    make_source,
    run_inline,
    sync_workers,
)

pytestmark = pytest.mark.browser


def _elsewhere(fn):
    """Run on another thread: Playwright's sync API keeps an event loop in this one."""

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
def held(fleet, operator, approver):
    """v1 then v2 verified; v3 held by a failing update in rl-b; an approver force-reopened
    rl-c (the refresh let go of it and holds the rest)."""

    def produce():
        source = make_source(fleet)
        sync_workers(source)
        assert run_inline(source, operator, "v1").state == RefreshState.SUCCEEDED
        assert run_inline(source, operator, "v2").state == RefreshState.SUCCEEDED
        bad = next(w["key"] for w in fleet.workers() if w["namespace"] == "rl-b")
        fleet.inject(bad, "update_weights_from_disk", Fault.error("disk full"))
        refresh = run_inline(source, operator, "v3")
        assert refresh.state == RefreshState.HELD
        fleet.clear_faults(bad)
        gate = Gate.objects.get(source=source, namespace="rl-c")
        intents.force_reopen_gate(gate, actor=actor_for(approver), reason="eval run waits")
        execute_refresh(refresh.pk)
        refresh.refresh_from_db()
        assert refresh.state == RefreshState.HELD
        return refresh

    return _elsewhere(produce)


def versions_in(fleet, namespace):
    return {w["version"] for w in fleet.workers() if w["namespace"] == namespace}


def _open_rollback_page(page, held):
    page.goto(f"/refreshes/{held.pk}/")
    page.click("#cockpit #rollback-refresh")
    page.wait_for_selector("#revision-history")
    # Newest first: v2 (current where the gates stand for it), then v1.
    versions = page.locator("#revision-history tbody tr").evaluate_all(
        "rows => rows.map(r => r.dataset.version)"
    )
    assert versions == ["v2", "v1"]


def test_rollback_to_an_older_version_goes_through_its_plan_page(page, fleet, held, operator):
    rl_c_before = versions_in(fleet, "rl-c")
    sign_in(page, operator.username, PASSWORD)
    _open_rollback_page(page, held)
    # The force-reopened namespace is offered, unticked, and says why.
    forced = page.locator("#rollback-namespaces li[data-namespace=rl-c]")
    assert not forced.locator("input[type=checkbox]").is_checked()
    assert "forced it open" in forced.inner_text()
    for ns in ("rl-a", "rl-b"):
        assert page.locator(f"#rollback-namespaces li[data-namespace={ns}] input").is_checked()

    page.check("#revision-history tr[data-version=v1] input[type=radio]")
    page.click("#plan-rollback")
    page.wait_for_selector("#cockpit #refresh-state[data-state=planned]", timeout=30_000)
    rollback = PolicyRefresh.objects.exclude(pk=held.pk).order_by("-pk").first()
    assert page.url.endswith(f"/refreshes/{rollback.pk}/")
    # Planned, not started: the held refresh still owns its scope, nothing moved.
    assert rollback.state == RefreshState.PLANNED and rollback.rollback_of_id == held.pk
    assert rollback.target["weight_version"] == "v1" and rollback.namespaces == ["rl-a", "rl-b"]
    assert PolicyRefresh.objects.get(pk=held.pk).state == RefreshState.HELD
    rows = page.locator("#namespace-gates tbody tr")
    assert rows.evaluate_all("rows => rows.map(r => r.dataset.namespace)") == ["rl-a", "rl-b"]
    assert all(t.strip() == "v1" for t in page.locator(".ns-target").all_inner_texts())

    with page.expect_navigation():
        page.click("#confirm-refresh")
    rollback.refresh_from_db()
    assert rollback.state == RefreshState.GATING
    _elsewhere(lambda: execute_refresh(rollback.pk))
    page.wait_for_selector("#refresh-state[data-state=succeeded]", timeout=30_000)

    assert PolicyRefresh.objects.get(pk=held.pk).state == RefreshState.ROLLED_BACK
    assert versions_in(fleet, "rl-a") == versions_in(fleet, "rl-b") == {"v1"}
    # The approver's decision stands: rl-c is still open (forced), its workers untouched.
    assert versions_in(fleet, "rl-c") == rl_c_before
    assert Gate.objects.get(source=held.source, namespace="rl-c").state == GateState.OPEN_FORCED
    page.goto("about:blank")


def test_a_force_reopened_namespace_is_rolled_back_only_when_ticked(page, fleet, held, operator):
    sign_in(page, operator.username, PASSWORD)
    _open_rollback_page(page, held)
    page.check("#revision-history tr[data-version=v1] input[type=radio]")
    page.check("#rollback-namespaces li[data-namespace=rl-c] input[type=checkbox]")
    page.click("#plan-rollback")
    page.wait_for_selector("#cockpit #refresh-state[data-state=planned]", timeout=30_000)
    rollback = PolicyRefresh.objects.exclude(pk=held.pk).order_by("-pk").first()
    assert rollback.namespaces == ["rl-a", "rl-b", "rl-c"]
    assert rollback.state == RefreshState.PLANNED

    # Leaving out a namespace the held refresh still holds is refused, nothing is planned.
    _open_rollback_page(page, held)
    page.check("#revision-history tr[data-version=v1] input[type=radio]")
    page.uncheck("#rollback-namespaces li[data-namespace=rl-b] input[type=checkbox]")
    page.click("#plan-rollback")
    page.wait_for_selector("text=still holds rl-b")
    assert (
        PolicyRefresh.objects.exclude(pk__in=[held.pk, rollback.pk])
        .filter(state=RefreshState.PLANNED)
        .count()
        == 0
    )
    page.goto("about:blank")
