"""From held: retry, rollback and force-reopen; membership changes; abort."""

from __future__ import annotations

import re
import threading

import pytest
from django.core.exceptions import ValidationError

from controlplane.accounts.tokens import create_token
from controlplane.audit.recorder import Actor
from controlplane.refresh import intents
from controlplane.refresh.errors import InvalidTransition
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import Gate, RefreshState, WorkerStepResult
from controlplane.simfleet import Fault, WorkerSpec
from tests.integration.refresh.cli import cli
from tests.integration.refresh.helpers import (
    actor_for,
    fleet_config,
    fleet_versions,
    make_source,
    paused_workers,
    plan,
    run_inline,
    wait_for,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(simfleet_factory):
    return simfleet_factory(fleet_config(6))


@pytest.fixture
def source(fleet):
    return make_source(fleet)


def keys_in(fleet, namespace):
    return [w["key"] for w in fleet.workers() if w["namespace"] == namespace]


def run_refresh(refresh):
    execute_refresh(refresh.pk)
    refresh.refresh_from_db()
    return refresh


def test_retry_after_fixing_the_fault_touches_only_the_failed_worker(fleet, source, operator):
    bad = keys_in(fleet, "rl-a")[0]
    fleet.inject(bad, "update_weights_from_disk", Fault.error("disk full"))
    refresh = run_inline(source, operator, "v2")
    assert refresh.state == RefreshState.HELD
    updates_before = {w["key"]: w["update_count"] for w in fleet.workers()}

    fleet.clear_faults(bad)
    intents.retry_policy_refresh(refresh, actor=actor_for(operator))
    refresh = run_refresh(refresh)

    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert set(fleet_versions(fleet).values()) == {"v2"}
    updates_after = {w["key"]: w["update_count"] for w in fleet.workers()}
    # The healthy workers were not updated a second time; the failed one was retried once.
    assert {k for k in updates_after if updates_after[k] != updates_before[k]} == {bad}
    assert WorkerStepResult.objects.filter(refresh=refresh, step="update").count() == 7
    assert all(g.is_open for g in Gate.objects.filter(source=source))


def test_rollback_restores_the_previous_verified_version(fleet, source, operator):
    assert run_inline(source, operator, "v1").state == RefreshState.SUCCEEDED
    fleet.inject(keys_in(fleet, "rl-b")[0], "generate", Fault.cancel())
    held = run_inline(source, operator, "v2")
    assert held.state == RefreshState.HELD
    fleet.clear_faults()

    rollback = intents.rollback_policy_refresh(held, actor=actor_for(operator))
    rollback = run_refresh(rollback)

    held.refresh_from_db()
    assert held.state == RefreshState.ROLLED_BACK and f"#{rollback.pk}" in held.end_reason
    assert held.finished_at is not None
    assert rollback.rollback_of_id == held.pk
    assert rollback.state == RefreshState.SUCCEEDED, rollback.held_reason
    assert set(fleet_versions(fleet).values()) == {"v1"}
    assert {g.verified_version for g in Gate.objects.filter(source=source)} == {"v1"}
    assert paused_workers(fleet) == []


def test_a_rolled_back_refresh_reads_rolled_back_on_the_page_the_api_and_the_cli(
    fleet, source, operator, viewer, viewer_client
):
    assert run_inline(source, operator, "v1").state == RefreshState.SUCCEEDED
    fleet.inject(keys_in(fleet, "rl-b")[0], "generate", Fault.cancel())
    held = run_inline(source, operator, "v2")
    fleet.clear_faults()
    rollback = intents.rollback_policy_refresh(held, actor=actor_for(operator))

    section = viewer_client.get("/refreshes/?state=rolled_back").content.decode()
    assert (
        f">#{held.pk}<" in section
        and '<span class="badge rolled_back">rolled back</span>' in section
    )
    completed = viewer_client.get("/refreshes/?state=succeeded").content.decode()
    assert f">#{held.pk}<" not in completed
    detail = viewer_client.get(f"/refreshes/{held.pk}/").content.decode()
    assert re.search(r'class="badge rolled_back" id="refresh-state"[^>]*>rolled back<', detail)

    _, secret = create_token(user=viewer, label="t", actor=Actor.system())
    listed = viewer_client.get(
        "/api/v1/refreshes?state=rolled_back", HTTP_AUTHORIZATION=f"Bearer {secret}"
    ).json()
    assert [r["id"] for r in listed["items"]] == [held.pk]
    assert listed["items"][0]["state"] == "rolled_back"

    code, out, _ = cli("refresh", "list", "--state", "rolled_back")
    assert code == 0 and out.splitlines()[1].split()[0] == str(held.pk)
    assert "rolled_back" in out.splitlines()[1]
    code, out, _ = cli("refresh", "status", str(held.pk))
    assert (
        "state: rolled_back" in out
        and f"ended: rolled back by policy refresh #{rollback.pk}" in out
    )


def test_force_reopen_requires_a_reason_and_resumes_the_paused_engines(
    fleet, source, operator, approver
):
    fleet.inject(keys_in(fleet, "rl-a")[0], "update_weights_from_disk", Fault.error())
    held = run_inline(source, operator, "v2")
    assert paused_workers(fleet)  # held leaves workers as they are
    gate = Gate.objects.get(source=source, namespace="rl-a")

    with pytest.raises(ValidationError):
        intents.force_reopen_gate(gate, actor=actor_for(approver), reason="  ")
    gate.refresh_from_db()
    assert not gate.is_open

    intents.force_reopen_gate(gate, actor=actor_for(approver), reason="trainer incident #42")
    gate.refresh_from_db()
    assert gate.is_open
    held = run_refresh(held)  # the executor resumes that namespace's engines and holds again
    assert held.state == RefreshState.HELD
    assert not any(k in keys_in(fleet, "rl-a") for k in paused_workers(fleet))
    assert set(paused_workers(fleet)) == set(keys_in(fleet, "rl-b") + keys_in(fleet, "rl-c"))
    assert not Gate.objects.get(source=source, namespace="rl-b").is_open
    # The rest is aborted: every engine runs again, the other gates stay closed.
    intents.abort_policy_refresh(held, actor=actor_for(approver), resume_engines=True)
    held = run_refresh(held)
    assert held.state == RefreshState.ABORTED
    assert paused_workers(fleet) == []
    assert not Gate.objects.get(source=source, namespace="rl-b").is_open
    assert Gate.objects.get(source=source, namespace="rl-a").state == "open_forced"


def remove_when(fleet, predicate, action, timeout=20.0):
    """Act on the fleet as soon as it reaches a state (polled on the fleet, not the DB)."""

    def watch():
        wait_for(lambda: predicate(fleet.workers()), timeout)
        action()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_worker_leaving_mid_refresh_holds_at_reopen(fleet, source, operator):
    leaver, slow = keys_in(fleet, "rl-a")[0], keys_in(fleet, "rl-b")[0]
    fleet.inject(slow, "generate", Fault.latency(1.0))
    watcher = remove_when(
        fleet,
        lambda ws: any(w["key"] == leaver and w["generation_count"] for w in ws),
        lambda: fleet.remove_worker(leaver),
    )
    refresh = run_inline(source, operator, "v2")
    watcher.join(5)
    assert refresh.state == RefreshState.HELD
    assert refresh.failed_step == "reopen"
    assert "membership changed" in refresh.held_reason and "left" in refresh.held_reason
    assert not any(g.is_open for g in Gate.objects.filter(source=source))


def test_worker_joining_mid_refresh_holds(fleet, source, operator):
    first = keys_in(fleet, "rl-a")[0]
    fleet.inject(first, "update_weights_from_disk", Fault.latency(0.5))
    watcher = remove_when(
        fleet,
        lambda ws: any(w["update_count"] for w in ws),
        lambda: fleet.add_worker(WorkerSpec(namespace="rl-c")),
    )
    refresh = run_inline(source, operator, "v2")
    watcher.join(5)
    assert refresh.state == RefreshState.HELD
    assert "joined" in refresh.held_reason
    assert not any(g.is_open for g in Gate.objects.filter(source=source))


def test_abort_is_refused_on_a_held_refresh_unless_engines_are_resumed(fleet, source, operator):
    fleet.inject(keys_in(fleet, "rl-a")[0], "update_weights_from_disk", Fault.error())
    held = run_inline(source, operator, "v2")
    with pytest.raises(InvalidTransition):
        intents.abort_policy_refresh(held, actor=actor_for(operator))
    intents.abort_policy_refresh(held, actor=actor_for(operator), resume_engines=True)
    held = run_refresh(held)
    assert held.state == RefreshState.ABORTED
    assert paused_workers(fleet) == []
    # Aborting never opens the gate: the fleet is at mixed versions.
    assert not any(g.is_open for g in Gate.objects.filter(source=source))


def test_plan_with_a_worker_lacking_the_update_route_cannot_start(fleet, source, operator):
    from controlplane.refresh.errors import PlanBlocked

    key = keys_in(fleet, "rl-a")[0]
    descriptor = fleet.call(lambda: fleet.fleet.get(key).descriptor())
    descriptor["routes"] = [r for r in descriptor["routes"] if r != "update_weights_from_disk"]
    fleet.inject(key, "probe", Fault.reply(descriptor))

    refresh = plan(source, operator)

    blocked = refresh.workers.get(instance_id=str(fleet.state(key)["instance_id"]))
    assert blocked.blockers == [
        "update: vllm disk reload needs update_weights_from_disk, "
        "which the worker does not advertise"
    ]
    assert refresh.plan_blockers == ["1 of 6 workers have blockers"]
    with pytest.raises(PlanBlocked):
        intents.start_policy_refresh(refresh, actor=actor_for(operator), enqueue=False)
    assert paused_workers(fleet) == []


def test_probe_error_blocks_the_plan(fleet, source, operator):
    key = keys_in(fleet, "rl-c")[0]
    fleet.inject(key, "probe", Fault.probe_error("engine is dead"))
    refresh = plan(source, operator)
    blocked = refresh.workers.get(instance_id=str(fleet.state(key)["instance_id"]))
    assert any("probe error" in b and "engine is dead" in b for b in blocked.blockers)
