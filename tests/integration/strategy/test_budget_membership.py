"""The failure budget covers workers that join, leave or change during a refresh, not only
failed steps: within the budget the refresh goes on and the gate opens for the verified set,
naming who was left out and why; over it, the refresh holds as without a budget."""

from __future__ import annotations

import pytest

from controlplane.refresh import intents
from controlplane.refresh.drift import reconcile_source
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.gates import serialize_gate
from controlplane.refresh.models import (
    PolicyRefresh,
    Quarantine,
    RefreshState,
    WorkerStepResult,
)
from controlplane.simfleet import Fault, WorkerSpec
from tests.integration.refresh.helpers import (
    actor_for,
    plan,
    sync_workers,
)
from tests.integration.strategy.helpers import WAVES_OF_TWO, gates_of, keys_in

pytestmark = pytest.mark.django_db


def identity_of(fleet, token: str) -> str:
    return next(w["identity"] for w in fleet.workers() if w["key"] == token)


def token_of(fleet, identity: str) -> str:
    return next(w["key"] for w in fleet.workers() if w["identity"] == identity)


def after_first_wave(source, operator, strategy) -> PolicyRefresh:
    """A waves refresh whose executor stopped once wave 1 verified (its lease handed over)."""
    refresh = plan(source, operator, "v2", strategy=strategy)
    assert not refresh.plan_blockers, refresh.plan_blockers
    intents.start_policy_refresh(refresh, actor=actor_for(operator), enqueue=False)
    assert execute_refresh(refresh.pk, stop_after="verify") == "stopped"
    refresh.refresh_from_db()
    assert refresh.wave == 2 and refresh.state == RefreshState.PAUSING
    PolicyRefresh.objects.filter(pk=refresh.pk).update(lease_owner="", lease_expires_at=None)
    return refresh


def go_on(refresh: PolicyRefresh) -> PolicyRefresh:
    execute_refresh(refresh.pk)
    refresh.refresh_from_db()
    return refresh


def test_a_joiner_during_waves_within_the_budget_is_left_out_and_named_on_the_gate(
    fleet, source, operator
):
    refresh = after_first_wave(source, operator, {**WAVES_OF_TWO, "max_failed": 1})
    joiner_key = identity_of(fleet, fleet.add_worker(WorkerSpec(namespace="rl-b")))
    joiner_id = joiner_key.rsplit("/", 1)[1]

    refresh = go_on(refresh)

    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert refresh.membership_change == {}
    gates = gates_of(source)
    assert all(g.state == "open" and g.verified_version == "v2" for g in gates.values())
    planned_b = set(refresh.workers.filter(namespace="rl-b").values_list("instance_id", flat=True))
    assert set(gates["rl-b"].verified_instances) == planned_b
    assert joiner_id not in gates["rl-b"].verified_instances
    # Never silently: the gate counts it unverified and lists it with why it is out.
    shown = serialize_gate(gates["rl-b"])
    assert shown["unverified_count"] == 1
    assert shown["left_out_count"] == 1
    entry = shown["left_out"][0]
    assert entry["instance_id"] == joiner_id and entry["key"] == joiner_key
    assert f"joined during policy refresh #{refresh.pk}" in entry["detail"]
    assert serialize_gate(gates["rl-a"])["left_out_count"] == 0
    # The joiner was never called by the refresh (it is still on its base weights).
    joiner = next(w for w in fleet.workers() if w["identity"] == joiner_key)
    assert joiner["version"] != "v2" and not joiner.get("paused")

    # Drift reconciliation then takes it over per the source's policy (quarantine).
    sync_workers(source)
    reconcile_source(source.pk)
    quarantine = Quarantine.objects.get(source=source, instance_id=joiner_id)
    assert quarantine.kind == "joined"
    assert quarantine.target["weight_version"] == "v2"


def test_a_leaver_and_a_joiner_within_the_budget_both_count_and_the_rest_open(
    fleet, source, operator
):
    refresh = after_first_wave(source, operator, {**WAVES_OF_TWO, "max_failed": 2})
    # A restart: the old instance leaves, a new instance id joins on base weights.
    leaver = keys_in(fleet, "rl-c")[0]
    leaver_key = identity_of(fleet, leaver)
    fleet.remove_worker(leaver)
    joiner_key = identity_of(fleet, fleet.add_worker(WorkerSpec(namespace="rl-c")))

    refresh = go_on(refresh)

    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    departed = WorkerStepResult.objects.get(refresh=refresh, status="departed")
    assert departed.planned_worker.key == leaver_key
    rl_c = gates_of(source)["rl-c"]
    assert len(rl_c.verified_instances) == 3
    assert leaver_key.rsplit("/", 1)[1] not in rl_c.verified_instances
    assert [e["key"] for e in serialize_gate(rl_c)["left_out"]] == [joiner_key]


def test_a_joiner_after_a_failure_that_used_the_budget_holds_at_reopen(fleet, source, operator):
    refresh = after_first_wave(source, operator, {**WAVES_OF_TWO, "max_failed": 1})
    broken = token_of(fleet, refresh.workers.filter(namespace="rl-a", wave=2).first().key)
    fleet.inject(broken, "update_weights_from_disk", Fault.error("disk full"))
    joiner_key = identity_of(fleet, fleet.add_worker(WorkerSpec(namespace="rl-b")))

    refresh = go_on(refresh)

    assert refresh.state == RefreshState.HELD
    assert refresh.failed_step == "reopen"
    assert "over the failure budget" in refresh.held_reason
    assert f"joined: {joiner_key}" in refresh.held_reason
    # The hold is the membership hold of today: resolve membership acts on exactly it.
    assert refresh.membership_change["joined"] == [joiner_key]
    assert Quarantine.objects.filter(source=source, kind="left_out").count() == 1
    assert not any(g.verified_version == "v2" for g in gates_of(source).values())


def test_without_a_budget_a_joiner_during_waves_holds_as_before(fleet, source, operator):
    refresh = after_first_wave(source, operator, WAVES_OF_TWO)
    joiner_key = identity_of(fleet, fleet.add_worker(WorkerSpec(namespace="rl-b")))

    refresh = go_on(refresh)

    assert refresh.state == RefreshState.HELD and refresh.failed_step == "reopen"
    assert refresh.membership_change["joined"] == [joiner_key]
    assert "failure budget" not in refresh.held_reason


def test_a_worker_changed_at_reopen_within_the_budget_is_paused_and_quarantined(
    fleet, source, operator
):
    refresh = after_first_wave(source, operator, {**WAVES_OF_TWO, "max_failed": 1})
    # Verified in wave 1, serving v2 since.
    changed = token_of(fleet, refresh.workers.filter(namespace="rl-a", wave=1).first().key)
    changed_key = identity_of(fleet, changed)
    fleet.inject(changed, "probe", Fault.probe_error("engine is dead"))

    refresh = go_on(refresh)

    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    quarantine = Quarantine.objects.get(source=source, key=changed_key)
    assert quarantine.kind == "left_out" and quarantine.state == "failed"
    assert "listed with an error" in quarantine.reason
    rl_a = serialize_gate(gates_of(source)["rl-a"])
    assert changed_key.rsplit("/", 1)[1] not in rl_a["verified_instances"]
    assert rl_a["left_out_count"] == 1 and "changed during" in rl_a["left_out"][0]["detail"]
