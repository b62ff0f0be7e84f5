"""Plans and reopens fail closed on what discovery could not trust: rejected listener entries,
workers outside the declared scope, other deployments under a global scope, and static workers
whose identity is unknown (refreshed by URL, never pinned, never verified)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from controlplane.audit.recorder import Actor
from controlplane.fleet import services
from controlplane.refresh import intents
from controlplane.refresh.errors import PlanBlocked
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import Gate, PolicyRefresh, RefreshState
from controlplane.simfleet import Fault, FleetConfig, WorkerSpec
from tests.integration.refresh.helpers import (
    actor_for,
    fleet_config,
    fleet_versions,
    make_source,
    paused_workers,
    plan,
    run_inline,
)

pytestmark = pytest.mark.django_db

#: A descriptor the real listener passes through and our parser rejects (not an HTTP URL).
UNREADABLE = {"status": "ok", "routes": ["pause_generation"], "system_url": "ftp://127.0.0.1:21"}


def all_blockers(refresh) -> str:
    worker_blockers = [b for w in refresh.workers.all() for b in w.blockers]
    return " | ".join([*refresh.plan_blockers, *worker_blockers])


@pytest.fixture
def fleet(simfleet_factory):
    return simfleet_factory(fleet_config(4))


def test_a_rejected_entry_blocks_a_plan_of_its_namespace_only(fleet, operator):
    source = make_source(fleet)
    odd = next(w for w in fleet.workers() if w["namespace"] == "rl-a")
    fleet.inject(odd["key"], "probe", Fault.reply(UNREADABLE))

    blocked = plan(source, operator, "v2", namespaces=["rl-a"])
    text = " | ".join(blocked.plan_blockers)
    assert "in namespace 'rl-a' rejected" in text and "system_url" in text, text
    elsewhere = plan(source, operator, "v2", namespaces=["rl-b"])
    assert not any("rejected" in b for b in elsewhere.plan_blockers), elsewhere.plan_blockers
    assert paused_workers(fleet) == []


def test_a_rejected_entry_at_reopen_holds_instead_of_opening_verified(fleet, operator):
    source = make_source(fleet)
    refresh = plan(source, operator, "v2")
    assert not refresh.plan_blockers, refresh.plan_blockers
    intents.start_policy_refresh(refresh, actor=actor_for(operator), enqueue=False)
    execute_refresh(refresh.pk, stop_after="verify")
    PolicyRefresh.objects.filter(pk=refresh.pk).update(lease_owner="", lease_expires_at=None)
    odd = next(w for w in fleet.workers() if w["namespace"] == "rl-a")
    fleet.inject(odd["key"], "probe", Fault.reply(UNREADABLE))

    execute_refresh(refresh.pk)
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.HELD and refresh.failed_step == "reopen"
    assert "in namespace 'rl-a' rejected" in refresh.held_reason, refresh.held_reason
    assert not Gate.objects.filter(source=source, state="open", verified_version="v2").exists()

    # The exit: once the listener's answer is readable, a retry reopens verified.
    fleet.clear_faults()
    intents.retry_policy_refresh(refresh, actor=actor_for(operator))
    execute_refresh(refresh.pk)
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason


def test_workers_outside_the_declared_scope_are_never_paused(fleet, operator):
    source = make_source(fleet, listener_scope="exact", expected_namespace="rl-a")
    refresh = plan(source, operator, "v2")
    text = all_blockers(refresh)
    assert "outside the declared listener scope: namespace 'rl-b'" in text, text
    with pytest.raises(PlanBlocked):
        intents.start_policy_refresh(refresh, actor=actor_for(operator), enqueue=False)
    assert paused_workers(fleet) == []
    # The declared namespace alone is plannable.
    done = run_inline(source, operator, "v2", namespaces=["rl-a"])
    assert done.state == RefreshState.SUCCEEDED, done.held_reason


def test_a_global_scope_plan_must_name_the_other_deployments(simfleet_factory, operator):
    fleet = simfleet_factory(
        FleetConfig.generate(
            workers=4,
            namespaces=("prod", "team-b"),
            listener_env={"DYN_NAMESPACE_PREFIX": "dynamo", "DYN_RL_REQUEST_TIMEOUT_SECS": "2"},
            seed=5,
        )
    )
    source = make_source(
        fleet, expected_prefix="", listener_scope="global", expected_namespace="prod"
    )
    unnamed = plan(source, operator, "v2")
    text = " | ".join(unnamed.plan_blockers)
    assert "would pause workers of team-b (2 workers); name these namespaces" in text, text
    assert paused_workers(fleet) == []
    named = run_inline(source, operator, "v2", namespaces=["prod", "team-b"])
    assert named.state == RefreshState.SUCCEEDED, named.held_reason
    assert set(fleet_versions(fleet).values()) == {"v2"}


def test_a_static_worker_of_unknown_identity_is_refreshed_but_never_pinned_or_verified(
    simfleet_factory, operator, client
):
    fleet = simfleet_factory(FleetConfig(workers=[], listener_env={"DYN_NAMESPACE": "rl-a"}))
    key = fleet.add_worker(
        WorkerSpec(
            namespace="rl-a", family="sglang", engine_routes=["get_weight_version"], version="v1"
        )
    )
    source = make_source(fleet, expected_prefix="")
    services.add_static_worker(
        source,
        actor=Actor.system("test"),
        name="sgl-1",
        namespace="rl-a",
        # The frontend registers it as rl-a/backend/generate: nothing matches this component,
        # so nothing registered is known to be this worker.
        component="sglang-pool",
        system_url=fleet.state(key)["system_url"],
        family="sglang",
        allowed_routes=[
            "pause_generation",
            "continue_generation",
            "control/update_weights_from_disk",
            "get_weight_version",
        ],
        model="sim-model",
    )
    refresh = plan(source, operator, "v2")
    assert not refresh.plan_blockers, all_blockers(refresh)
    # The plan says so (a view of the planned worker's empty instance id).
    client.force_login(operator)
    page = client.get(reverse("refresh:detail", args=[refresh.pk])).content.decode()
    assert "identity unknown" in page and "never pinned for verification" in page
    intents.start_policy_refresh(refresh, actor=actor_for(operator), enqueue=False)
    execute_refresh(refresh.pk)
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert set(fleet_versions(fleet).values()) == {"v2"}
    (planned,) = refresh.workers.all()
    assert planned.instance_id == ""
    assert not any(c.get("operation") == "generation" for c in planned.calls["verify"])
    gate = Gate.objects.get(source=source, namespace="rl-a")
    assert gate.verified_instances == []
