"""A worker that leaves, joins or changes during a refresh holds it by default, and the hold
names who (worker keys, namespaces); one action — resolve membership — drops the leavers, leaves
the joiners out of the verified set and reopens for the verified set. The reopen re-reads
discovery and compares identities, routes and errors, so a retry after the fix succeeds."""

from __future__ import annotations

import pytest

from controlplane.audit.models import AuditEvent
from controlplane.refresh import intents
from controlplane.refresh.errors import InvalidTransition
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import (
    Gate,
    GateState,
    PolicyRefresh,
    RefreshState,
    ScopeLock,
    WorkerStepResult,
)
from controlplane.refresh.tasks import execute_policy_refresh
from controlplane.simfleet import Fault, WorkerSpec
from tests.integration.refresh.helpers import (
    actor_for,
    fleet_config,
    make_source,
    paused_workers,
    plan,
    sync_workers,
    wait_for,
)


@pytest.fixture
def fleet(simfleet_factory):
    return simfleet_factory(fleet_config(6))


@pytest.fixture
def source(fleet):
    return make_source(fleet)


def identity_of(fleet, token):
    return next(w["identity"] for w in fleet.workers() if w["key"] == token)


def token_in(fleet, namespace, index=0):
    return [w["key"] for w in fleet.workers() if w["namespace"] == namespace][index]


def run(refresh, **kwargs):
    execute_refresh(refresh.pk, **kwargs)
    refresh.refresh_from_db()
    return refresh


def verified_through(source, operator):
    """A started refresh whose executor stopped after verify and handed its lease over."""
    refresh = plan(source, operator, "v2")
    assert not refresh.plan_blockers, refresh.plan_blockers
    intents.start_policy_refresh(refresh, actor=actor_for(operator), enqueue=False)
    assert run(refresh, stop_after="verify").state == RefreshState.REOPENING
    PolicyRefresh.objects.filter(pk=refresh.pk).update(lease_owner="", lease_expires_at=None)
    return refresh


def planned_ids(refresh, namespace):
    return sorted(
        refresh.workers.filter(namespace=namespace).values_list("instance_id", flat=True), key=int
    )


def gate(source, namespace):
    return Gate.objects.get(source=source, namespace=namespace)


@pytest.mark.django_db(transaction=True)
def test_a_leaver_holds_and_one_action_drops_it_and_reopens_for_the_verified_set(
    fleet, source, operator, operator_client, celery_worker
):
    refresh = verified_through(source, operator)
    leaver = token_in(fleet, "rl-a")
    leaver_key = identity_of(fleet, leaver)
    leaver_id = leaver_key.rsplit("/", 1)[1]
    fleet.remove_worker(leaver)

    execute_policy_refresh.delay(refresh.pk)  # the executor goes on, through Celery
    wait_for(lambda: PolicyRefresh.objects.get(pk=refresh.pk).state == RefreshState.HELD)
    refresh.refresh_from_db()
    assert refresh.failed_step == "reopen"
    assert refresh.membership_change["left"] == [leaver_key]
    assert refresh.membership_change["namespaces"] == ["rl-a"]
    assert f"left: {leaver_key}" in refresh.held_reason
    assert not any(g.is_open for g in Gate.objects.filter(source=source))
    page = operator_client.get(f"/refreshes/{refresh.pk}/").content.decode()
    assert 'id="membership-change"' in page and leaver_key in page
    assert 'id="resolve-membership"' in page

    response = operator_client.post(f"/refreshes/{refresh.pk}/resolve-membership/")
    assert response.status_code == 302
    wait_for(lambda: PolicyRefresh.objects.get(pk=refresh.pk).state == RefreshState.SUCCEEDED)

    refresh.refresh_from_db()
    departed = WorkerStepResult.objects.get(refresh=refresh, status="departed")
    assert departed.planned_worker.key == leaver_key and "dropped by" in departed.error
    rl_a = gate(source, "rl-a")
    assert rl_a.state == GateState.OPEN and rl_a.verified_version == "v2"
    assert rl_a.verified_instances == [i for i in planned_ids(refresh, "rl-a") if i != leaver_id]
    assert rl_a.unverified_count == 0
    assert all(g.state == GateState.OPEN for g in Gate.objects.filter(source=source))
    assert not ScopeLock.objects.filter(source=source).exists()
    assert paused_workers(fleet) == []
    audit = AuditEvent.objects.get(
        correlation_id=refresh.correlation_id, action="policy_refresh.membership_resolved"
    )
    assert audit.details["dropped"] == [leaver_key] and audit.details["step"] == "reopen"


@pytest.mark.django_db
def test_a_joiner_is_named_and_left_out_of_the_verified_set(fleet, source, operator):
    refresh = verified_through(source, operator)
    joiner = fleet.add_worker(WorkerSpec(namespace="rl-b"))
    joiner_key = identity_of(fleet, joiner)

    refresh = run(refresh)
    assert refresh.state == RefreshState.HELD and refresh.failed_step == "reopen"
    assert refresh.membership_change["joined"] == [joiner_key]
    assert refresh.membership_change["namespaces"] == ["rl-b"]
    assert f"joined: {joiner_key}" in refresh.held_reason

    intents.resolve_membership(refresh, actor=actor_for(operator))
    refresh = run(refresh)

    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert refresh.left_out == [joiner_key]
    rl_b = gate(source, "rl-b")
    assert rl_b.state == GateState.OPEN
    assert rl_b.verified_instances == planned_ids(refresh, "rl-b")
    assert joiner_key.rsplit("/", 1)[1] not in rl_b.verified_instances
    assert rl_b.unverified_count == 1
    assert gate(source, "rl-a").unverified_count == 0
    # Nothing was dropped: the joiner was never part of the refresh.
    assert not WorkerStepResult.objects.filter(refresh=refresh, status="departed").exists()


@pytest.mark.django_db
def test_a_restart_is_a_leaver_and_a_joiner_resolved_in_one_action(fleet, source, operator):
    refresh = verified_through(source, operator)
    old = token_in(fleet, "rl-c")
    old_key = identity_of(fleet, old)
    fleet.remove_worker(old)
    new_key = identity_of(fleet, fleet.add_worker(WorkerSpec(namespace="rl-c")))

    refresh = run(refresh)
    assert refresh.membership_change["left"] == [old_key]
    assert refresh.membership_change["joined"] == [new_key]

    intents.resolve_membership(refresh, actor=actor_for(operator))
    refresh = run(refresh)
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    rl_c = gate(source, "rl-c")
    assert old_key.rsplit("/", 1)[1] not in rl_c.verified_instances
    assert len(rl_c.verified_instances) == 1 and rl_c.unverified_count == 1


@pytest.mark.django_db
def test_reopen_compares_errors_and_a_retry_after_the_fix_succeeds(fleet, source, operator):
    refresh = verified_through(source, operator)
    sick = token_in(fleet, "rl-a", 1)
    sick_key = identity_of(fleet, sick)
    fleet.inject(sick, "probe", Fault.probe_error("engine is dead"))

    refresh = run(refresh)
    # Same keys as planned, but one is listed with an error: not the worker that was verified.
    assert refresh.state == RefreshState.HELD, "opened with an erroring worker in the set"
    assert refresh.membership_change["changed"] == [
        {"key": sick_key, "detail": "listed with an error: engine is dead"}
    ]
    assert not any(g.is_open for g in Gate.objects.filter(source=source))

    fleet.clear_faults(sick)
    intents.retry_policy_refresh(refresh, actor=actor_for(operator))
    refresh = run(refresh)
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert refresh.membership_change == {}
    assert gate(source, "rl-a").verified_instances == planned_ids(refresh, "rl-a")


@pytest.mark.django_db
def test_a_joiner_holds_every_retry_until_resolved_or_gone(fleet, source, operator):
    refresh = verified_through(source, operator)
    joiner = fleet.add_worker(WorkerSpec(namespace="rl-a"))
    refresh = run(refresh)
    assert refresh.state == RefreshState.HELD

    # Retrying does not make a joiner go away: the same hold, naming it again.
    intents.retry_policy_refresh(refresh, actor=actor_for(operator))
    refresh = run(refresh)
    assert refresh.state == RefreshState.HELD
    assert refresh.membership_change["joined"] == [identity_of(fleet, joiner)]

    fleet.remove_worker(joiner)  # the fix: it left again
    intents.retry_policy_refresh(refresh, actor=actor_for(operator))
    refresh = run(refresh)
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert all(g.unverified_count == 0 for g in Gate.objects.filter(source=source))


@pytest.mark.django_db
def test_a_joiner_before_the_pause_is_left_out_and_never_touched(fleet, source, operator):
    refresh = plan(source, operator, "v2")
    joiner = fleet.add_worker(WorkerSpec(namespace="rl-a"))
    joiner_key = identity_of(fleet, joiner)
    intents.start_policy_refresh(refresh, actor=actor_for(operator), enqueue=False)
    refresh = run(refresh)
    assert refresh.state == RefreshState.HELD and refresh.failed_step == "resolve"
    assert refresh.membership_change["joined"] == [joiner_key]

    intents.resolve_membership(refresh, actor=actor_for(operator))
    refresh = run(refresh)

    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert fleet.state(joiner)["version"] != "v2"  # never paused, updated or resumed
    assert fleet.state(joiner)["update_count"] == 0
    assert gate(source, "rl-a").unverified_count == 1


@pytest.mark.django_db
def test_resolve_membership_is_refused_unless_a_membership_change_holds(fleet, source, operator):
    fleet.inject(token_in(fleet, "rl-a"), "update_weights_from_disk", Fault.error("disk full"))
    sync_workers(source)
    refresh = plan(source, operator, "v2")
    intents.start_policy_refresh(refresh, actor=actor_for(operator), enqueue=False)
    refresh = run(refresh)
    assert refresh.state == RefreshState.HELD and refresh.failed_step == "update"

    with pytest.raises(InvalidTransition, match="not held on a membership change"):
        intents.resolve_membership(refresh, actor=actor_for(operator))
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.HELD and refresh.left_out == []
