"""Plan-wide blockers: the source's frontend and networks, and membership that moved under the
plan. The discovery refresh a plan runs first is replaced by a function that writes what a
real one would have written, so the planner's own comparison is what is tested."""

from __future__ import annotations

import pytest
from django.utils import timezone

from controlplane.audit.recorder import Actor
from controlplane.fleet.models import Source, Worker, WorkerState
from controlplane.refresh import intents
from controlplane.refresh.intents import plan as plan_intent
from controlplane.refresh.planning import normalize_verification, plan_level_blockers
from controlplane.refresh.planning import source_policy as policy_of
from tests.unit.refresh.builders import DISK, MODEL, POLICY, VLLM_ROUTES

ACTOR = Actor.system("planner test")


@pytest.mark.parametrize(
    ("frontend_url", "verification", "blockers"),
    [
        ("http://10.0.0.2:8000", None, []),
        ("", None, ["the generation check needs the source's frontend URL"]),
        ("", {"generation": False}, []),
        (
            "http://172.16.0.2:8000",
            None,
            [
                "frontend URL outside the allowed networks: "
                "host '172.16.0.2' resolves to 172.16.0.2, outside the allowed networks"
            ],
        ),
    ],
    ids=["ok", "no-frontend", "no-generation-check", "frontend-outside"],
)
def test_generation_check_needs_a_reachable_frontend(frontend_url, verification, blockers):
    source = Source(name="s", listener_url="http://10.0.0.1:8001", frontend_url=frontend_url)
    found = plan_level_blockers(
        source, verification=normalize_verification(verification), policy=POLICY
    )
    assert found == blockers


def test_invalid_allowed_networks_block_the_plan():
    source = Source(name="s", frontend_url="http://10.0.0.2:8000", allowed_networks=["10.0.0.1/8"])
    policy = policy_of(source)
    assert policy is None
    found = plan_level_blockers(source, verification=normalize_verification({}), policy=policy)
    assert found == ["the source's allowed networks are invalid"]


# -- membership against the last view (database) --------------------------------------------------


def make_worker(source: Source, instance_id: int, **fields) -> Worker:
    now = timezone.now()
    values = {
        "source": source,
        "namespace": "rl-a",
        "component": "backend",
        "endpoint": "generate",
        "instance_id": str(instance_id),
        "family": "vllm",
        "system_url": f"http://10.0.0.{instance_id % 200 + 1}:9090",
        "model": MODEL,
        "routes": VLLM_ROUTES,
        "first_seen_at": now,
        "last_seen_at": now,
        **fields,
    }
    return Worker.objects.create(**values)


@pytest.fixture
def source(db):
    source = Source.objects.create(
        name="fleet-a",
        listener_url="http://10.0.0.1:8001",
        frontend_url="http://10.0.0.2:8000",
        allowed_networks=["10.0.0.0/8"],
    )
    make_worker(source, 2**63 + 1)
    make_worker(source, 2**63 + 2)
    return source


def discovery_that(monkeypatch, change) -> None:
    def fake(source):
        change(source)
        return None, ""

    monkeypatch.setattr(plan_intent, "fresh_discovery", fake)


def plan(source):
    return intents.plan_policy_refresh(source=source, actor=ACTOR, target=DISK)


def test_unchanged_membership_plans_without_blockers(source, monkeypatch):
    discovery_that(monkeypatch, lambda s: None)
    refresh = plan(source)
    assert refresh.plan_blockers == []
    assert refresh.plan_membership == sorted(w.key for w in source.workers.all())
    assert refresh.workers.count() == 2


def test_membership_that_moved_during_the_plan_is_a_blocker(source, monkeypatch):
    def one_left_one_joined(s):
        Worker.objects.filter(instance_id=str(2**63 + 1)).update(state=WorkerState.GONE)
        make_worker(s, 2**63 + 3)

    discovery_that(monkeypatch, one_left_one_joined)
    refresh = plan(source)
    assert refresh.plan_blockers == [
        "membership differs from the last view (1 joined, 1 left); review the fleet and plan again"
    ]
    # The plan is of the fleet as it is now, so a re-plan can succeed.
    assert [w.instance_id for w in refresh.workers.order_by("instance_id")] == [
        str(2**63 + 2),
        str(2**63 + 3),
    ]


def test_a_blocked_worker_blocks_the_plan_and_keeps_its_own_reason(source, monkeypatch):
    discovery_that(monkeypatch, lambda s: None)
    Worker.objects.filter(instance_id=str(2**63 + 2)).update(error="connection refused")
    refresh = plan(source)
    assert refresh.plan_blockers == ["1 of 2 workers have blockers"]
    blocked = refresh.workers.get(instance_id=str(2**63 + 2))
    assert blocked.blockers == ["probe error: connection refused"]


def test_a_failed_discovery_blocks_the_plan(source, monkeypatch):
    monkeypatch.setattr(plan_intent, "fresh_discovery", lambda s: (None, "discovery failed: boom"))
    assert plan(source).plan_blockers == ["discovery failed: boom"]
