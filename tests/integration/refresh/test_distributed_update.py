"""Distributed (collective) updates at fleet size on the simulated fleet.

The simulated group forms only when every rank has joined, and a vLLM worker whose join
outlives its watchdog exits; the stand-in trainer broadcasts only when the test trainer tells
it to. So these tests fail if joins are bounded by the fan-out, if ranks collide, if the
workers apply before the trainer's broadcast, or if the group is not torn down.
"""

from __future__ import annotations

import json

import pytest
from django.test import Client

from controlplane.accounts.tokens import create_token
from controlplane.audit.models import AuditEvent
from controlplane.audit.recorder import Actor
from controlplane.intake.models import WebhookEndpoint
from controlplane.notify.models import NotificationDelivery, NotificationDestination
from controlplane.refresh import intents
from controlplane.refresh.intents import base
from controlplane.refresh.models import JournalEntry, RefreshState
from tests.integration.intake.conftest import SECRET, post_webhook
from tests.integration.refresh.helpers import (
    actor_for,
    execute_in_thread,
    fleet_config,
    fleet_versions,
    make_source,
    paused_workers,
    sync_workers,
)

GROUP = {"master_address": "10.1.0.1", "master_port": 29500, "group_name": "rl-weights"}
UPDATE = {"names": ["lm_head.weight"], "dtypes": ["bfloat16"], "shapes": [[8, 8]]}


def distributed(version="v9", **extra):
    return {
        "weight_version": version,
        "method": "distributed",
        "group": GROUP,
        "update": UPDATE,
        "init_timeout_s": 6,
        "broadcast_timeout_s": 40,
        **extra,
    }


def big_fleet(simfleet_factory, workers=64):
    config = fleet_config(workers, seed=11)
    for i, spec in enumerate(config.workers):
        spec.init_weights_timeout = 6.0  # joins bounded by the fan-out would hit this
        spec.world_size = 2 if i % 4 == 0 else 1  # some workers hold two ranks
    return simfleet_factory(config)


@pytest.fixture
def small_fanout(settings):
    # Far below the worker count: a join bounded by it could never let the group form.
    settings.REFRESH_CONCURRENCY = 8


def plan_and_start(source, user, target):
    sync_workers(source)
    refresh = intents.plan_policy_refresh(source=source, actor=actor_for(user), target=target)
    assert not refresh.plan_blockers, refresh.plan_blockers
    intents.start_policy_refresh(refresh, actor=actor_for(user), enqueue=False)
    return refresh


def api_client(user) -> tuple[Client, dict]:
    _, secret = create_token(user=user, label="trainer", actor=Actor.system())
    return Client(), {"HTTP_AUTHORIZATION": f"Bearer {secret}"}


def wait_until_ready(client, auth, refresh_id) -> dict:
    """The trainer's long poll: follow the group until every rank joined."""
    state = None
    for _ in range(20):
        answer = client.get(
            f"/api/v1/refreshes/{refresh_id}/group",
            {"wait": 20, **({"after": state} if state is not None else {})},
            **auth,
        )
        assert answer.status_code == 200, answer.content
        group = answer.json()
        if group["state"] == "ready":
            return group
        assert group["state"] in ("", "joining", "torn_down"), group  # torn_down: a retry
        state = group["state"]
    raise AssertionError("the group never became ready")


def assert_rank_map(refresh, group_view):
    workers = list(refresh.workers.order_by("rank_offset"))
    ranks = [(w.rank_offset, w.ranks) for w in workers]
    # Distinct, contiguous, after the trainer's rank 0, and covering the whole world.
    expected_offset = 1
    for offset, count in ranks:
        assert offset == expected_offset
        expected_offset += count
    assert refresh.group["world_size"] == expected_offset == group_view["world_size"]
    assert group_view["ranks"] == {w.key: [w.rank_offset, w.ranks] for w in workers}


def assert_joined_concurrently(refresh, workers):
    joins = list(JournalEntry.objects.filter(refresh=refresh, step="group_init", ok=True))
    assert len(joins) == workers
    # Every join was in flight before any finished: they rendezvoused.
    assert max(j.started_at for j in joins) < min(j.finished_at for j in joins)
    bodies = [j.request_body for j in joins]
    assert len({b["rank_offset"] for b in bodies}) == workers
    assert all(b["master_port"] == 29500 and "init_info" not in b for b in bodies)


@pytest.mark.usefixtures("small_fanout")
def test_64_workers_join_concurrently_and_apply_after_the_trainer_reports_over_the_api(
    simfleet_factory, transactional_db, operator
):
    fleet = big_fleet(simfleet_factory)
    source = make_source(fleet)
    NotificationDestination.objects.create(
        name="trainer-hook", kind="webhook", url="http://127.0.0.1:9/hook", secret=SECRET
    )
    refresh = plan_and_start(source, operator, distributed())
    client, auth = api_client(operator)
    thread, done = execute_in_thread(refresh)

    group = wait_until_ready(client, auth, refresh.pk)
    refresh.refresh_from_db()
    assert_rank_map(refresh, group)
    # Before the broadcast nothing applied: the workers are paused in a formed group.
    assert set(fleet_versions(fleet).values()) != {"v9"}
    (formed,) = fleet.groups()
    assert formed["formed"] and formed["world_size"] == group["world_size"]

    assert fleet.broadcast("v9") == 1
    answer = client.post(
        f"/api/v1/refreshes/{refresh.pk}/broadcast_done",
        json.dumps({"weight_version": "v9"}),
        content_type="application/json",
        **auth,
    )
    assert answer.status_code == 200, answer.content
    thread.join(90)

    refresh.refresh_from_db()
    assert done == [RefreshState.SUCCEEDED], refresh.held_reason
    assert set(fleet_versions(fleet).values()) == {"v9"}
    assert paused_workers(fleet) == []
    assert_joined_concurrently(refresh, 64)
    assert refresh.group["state"] == "destroyed"
    assert fleet.groups() == []  # every rank left the group
    destroys = JournalEntry.objects.filter(refresh=refresh, step="group_destroy", ok=True)
    assert destroys.count() == 64
    audited = set(
        AuditEvent.objects.filter(correlation_id=refresh.correlation_id).values_list(
            "action", flat=True
        )
    )
    assert {"policy_refresh.group_ready", "policy_refresh.broadcast_done"} <= audited
    (ready,) = NotificationDelivery.objects.filter(event="refresh.group_ready")
    assert ready.payload["data"]["refresh"]["group"]["world_size"] == group["world_size"]
    # The compatibility record names the topology the group had.
    assert refresh.compat["topology"]["group_world_size"] == group["world_size"]
    assert refresh.compat["update_method"] == "distributed"


@pytest.mark.usefixtures("small_fanout")
def test_the_trainer_reports_over_a_signed_webhook(simfleet_factory, transactional_db, operator):
    fleet = big_fleet(simfleet_factory, workers=16)
    source = make_source(fleet)
    WebhookEndpoint.objects.create(name="trainer-a", source=source, secrets=[SECRET])
    refresh = plan_and_start(source, operator, distributed("v10"))
    client, auth = api_client(operator)
    thread, done = execute_in_thread(refresh)
    wait_until_ready(client, auth, refresh.pk)

    fleet.broadcast("v10")
    body = json.dumps(
        {"type": "broadcast.done", "data": {"refresh_id": refresh.pk, "weight_version": "v10"}}
    ).encode()
    answer = post_webhook(Client(), body, webhook_id="msg_bcast_1")
    assert answer.status_code == 200, answer.content
    assert answer.json()["outcome"] == "broadcast_done"
    # The same webhook id again changes nothing and answers the same.
    again = post_webhook(Client(), body, webhook_id="msg_bcast_1")
    assert again.status_code == 200
    thread.join(60)

    refresh.refresh_from_db()
    assert done == [RefreshState.SUCCEEDED], refresh.held_reason
    assert set(fleet_versions(fleet).values()) == {"v10"}
    assert refresh.group["broadcast_done_by"].startswith("webhook")


def test_a_broadcast_done_for_another_version_or_too_early_is_refused(
    simfleet_factory, transactional_db, operator
):
    fleet = big_fleet(simfleet_factory, workers=4)
    source = make_source(fleet)
    refresh = plan_and_start(source, operator, distributed("v11"))
    client, auth = api_client(operator)
    early = client.post(
        f"/api/v1/refreshes/{refresh.pk}/broadcast_done", "{}", "application/json", **auth
    )
    assert early.status_code == 409
    assert "not waiting for a broadcast" in early.json()["error"]["message"]

    thread, done = execute_in_thread(refresh)
    wait_until_ready(client, auth, refresh.pk)
    wrong = client.post(
        f"/api/v1/refreshes/{refresh.pk}/broadcast_done",
        json.dumps({"weight_version": "v3"}),
        content_type="application/json",
        **auth,
    )
    assert wrong.status_code == 409
    fleet.broadcast("v11")
    ok = client.post(
        f"/api/v1/refreshes/{refresh.pk}/broadcast_done", "{}", "application/json", **auth
    )
    assert ok.status_code == 200
    thread.join(60)
    assert done == [RefreshState.SUCCEEDED]


def test_a_trainer_that_never_reports_holds_the_refresh_with_the_group_torn_down(
    simfleet_factory, transactional_db, operator
):
    fleet = big_fleet(simfleet_factory, workers=8)
    source = make_source(fleet)
    refresh = plan_and_start(source, operator, distributed("v12", broadcast_timeout_s=1.5))
    thread, done = execute_in_thread(refresh)
    thread.join(60)

    refresh.refresh_from_db()
    assert done == [RefreshState.HELD]
    assert refresh.failed_step == "update"
    assert "did not report broadcast_done within 1.5 s" in refresh.held_reason
    assert "group torn down on 8 of 8 ranks" in refresh.held_reason
    assert refresh.group["state"] == "torn_down"
    assert fleet.groups() == []
    # No worker died, and every paused worker is owned by the held refresh.
    workers = fleet.workers()
    assert len(workers) == 8 and not any(w["dead"] for w in workers)
    assert len(paused_workers(fleet)) == 8
    assert refresh.locks.exists()


def test_a_mixed_vllm_and_sidecar_fleet_gets_the_right_body_per_family(
    simfleet_factory, transactional_db, operator
):
    config = fleet_config(6, seed=5)
    for i, spec in enumerate(config.workers):
        spec.family = "vllm-sidecar" if i % 2 else "vllm"
        spec.world_size = 2 if i % 2 else 1
    fleet = simfleet_factory(config)
    source = make_source(fleet)
    target = distributed("v13", update={**UPDATE, "update_infos": [{"names": ["lm_head.weight"]}]})
    refresh = plan_and_start(source, operator, target)
    client, auth = api_client(operator)
    thread, done = execute_in_thread(refresh)
    wait_until_ready(client, auth, refresh.pk)
    fleet.broadcast("v13")
    client.post(f"/api/v1/refreshes/{refresh.pk}/broadcast_done", "{}", "application/json", **auth)
    thread.join(60)

    refresh.refresh_from_db()
    assert done == [RefreshState.SUCCEEDED], refresh.held_reason
    assert set(fleet_versions(fleet).values()) == {"v13"}
    joins = {
        j.planned_worker.family: j
        for j in JournalEntry.objects.filter(refresh=refresh, step="group_init")
    }
    sidecar, python = joins["vllm-sidecar"], joins["vllm"]
    # The sidecar takes the group as init_info; the Python worker takes it flat.
    assert sidecar.url.endswith("/engine/update/init_weight_transfer_engine")
    assert set(sidecar.request_body) == {"init_info"}
    assert sidecar.request_body["init_info"]["world_size"] == refresh.group["world_size"]
    assert python.url.endswith("/engine/init_weights_update_group")
    assert {"master_address", "rank_offset", "world_size"} <= set(python.request_body)
    applied = JournalEntry.objects.filter(refresh=refresh, step="update")
    sidecar_bodies = [j.request_body for j in applied if j.url.endswith("/update/update_weights")]
    assert sidecar_bodies == [{"update_info": {"names": ["lm_head.weight"]}}] * 3
    python_bodies = [
        j.request_body for j in applied if j.url.endswith("/update_weights_from_distributed")
    ]
    assert all("update_infos" not in b and b["weight_version"] == "v13" for b in python_bodies)
    # Only the Python workers have a destroy route.
    assert JournalEntry.objects.filter(refresh=refresh, step="group_destroy").count() == 3


def test_a_retry_after_a_silent_trainer_re_forms_the_group_and_succeeds(
    simfleet_factory, transactional_db, operator, monkeypatch
):
    fleet = big_fleet(simfleet_factory, workers=4)
    source = make_source(fleet)
    refresh = plan_and_start(source, operator, distributed("v14", broadcast_timeout_s=1.0))
    thread, done = execute_in_thread(refresh)
    thread.join(60)
    assert done == [RefreshState.HELD]

    monkeypatch.setattr(base, "enqueue_execution", lambda refresh_id: None)  # run it here instead
    refresh.refresh_from_db()
    intents.retry_policy_refresh(refresh, actor=actor_for(operator))
    client, auth = api_client(operator)
    thread, done = execute_in_thread(refresh)
    group = wait_until_ready(client, auth, refresh.pk)
    assert group["broadcast_done_at"] is None  # the new group's handshake starts afresh
    assert group["attempt"] == 2  # a re-formed group: the report must name its attempt
    fleet.broadcast("v14")
    client.post(
        f"/api/v1/refreshes/{refresh.pk}/broadcast_done",
        json.dumps({"attempt": group["attempt"]}),
        "application/json",
        **auth,
    )
    thread.join(60)
    refresh.refresh_from_db()
    assert done == [RefreshState.SUCCEEDED], refresh.held_reason
    assert set(fleet_versions(fleet).values()) == {"v14"}
    joins = JournalEntry.objects.filter(refresh=refresh, step="group_init")
    assert sorted(joins.values_list("attempt", flat=True)) == [1] * 4 + [2] * 4
