"""Fifty trainers (or fifty API callers) hitting one scope at once, on PostgreSQL with a real
Celery worker and the simulated fleet: no 5xx, no deadlock, one refresh at a time, and every
webhook delivery ends with a truthful outcome that the trainer can read back.

Threads use the test client; each closes its database connection when done. Waiting is bounded
polling on database state, never a fixed sleep. The figures are printed (`-s` to see them).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest
from django.db import connection
from django.test import Client

from controlplane.accounts.roles import Role
from controlplane.accounts.services import create_user_with_role
from controlplane.accounts.tokens import create_token
from controlplane.audit.recorder import Actor
from controlplane.fleet import services as fleet_services
from controlplane.intake import services
from controlplane.intake.models import ReceivedWebhook, WebhookPolicy
from controlplane.refresh.gates import gate_state
from controlplane.refresh.models import PolicyRefresh, RefreshState
from controlplane.simfleet import Fault
from tests.integration.intake.conftest import post_webhook

pytestmark = pytest.mark.celery

BURST = 50
NAMESPACES = ("rl-a", "rl-b")
ENDED = {RefreshState.SUCCEEDED, RefreshState.HELD, RefreshState.FAILED, RefreshState.ABORTED}


def wait_for[T](predicate: Callable[[], T], *, timeout: float = 120.0, what: str = "") -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.05)


def deadlocks() -> int:
    """PostgreSQL's own count of deadlocks detected in the test database."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        return cursor.fetchone()[0]


def burst(n: int, request: Callable[[int], tuple[int, dict]]) -> list[tuple[int, dict]]:
    """Run `request(i)` for i < n in n threads released together."""
    barrier = threading.Barrier(n)
    results: list = [None] * n

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = request(i)
        except Exception as exc:  # recorded, so the test reports it instead of hanging
            results[i] = (-1, {"exception": repr(exc)})
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@pytest.fixture
def sim_source(simfleet, celery_worker):
    if connection.vendor != "postgresql":
        pytest.skip("concurrency is tested on PostgreSQL")
    return fleet_services.create_source(
        actor=Actor.system("test setup"),
        name="sim",
        listener_url=simfleet.listener_url,
        frontend_url=simfleet.frontend_url,
        expected_prefix="rl",
        allowed_networks=["127.0.0.0/8"],
    )


def bearer_for(role: Role, name: str) -> dict:
    user = create_user_with_role(name, role, "pw-not-used-1234", validate=False)
    _, secret = create_token(user=user, label=name, actor=Actor.system())
    return {"HTTP_AUTHORIZATION": f"Bearer {secret}"}


def test_fifty_concurrent_webhooks_on_one_scope(settings, sim_source, simfleet):
    # Fast backoff, and enough attempts to outlast a running refresh of the small fleet.
    settings.WEBHOOK_RETRY_BASE_SECONDS = 0.2
    settings.WEBHOOK_RETRY_MAX_SECONDS = 1.0
    settings.WEBHOOK_MAX_ATTEMPTS = 60
    endpoint, secret = services.create_webhook_endpoint(
        actor=Actor.system("test setup"),
        name="trainer-run-7",
        source=sim_source,
        policy=WebhookPolicy.AUTO_START,
    )
    viewer = bearer_for(Role.VIEWER, "trainer-reader")
    deadlocks_before = deadlocks()

    def send(i: int) -> tuple[int, dict]:
        body = json.dumps(
            {
                "type": "checkpoint.ready",
                "data": {"weight_version": f"step-{i}", "model_path": f"/checkpoints/step-{i}"},
            }
        ).encode()
        response = post_webhook(
            Client(), body, secret=secret, webhook_id=f"msg_burst_{i}", endpoint=endpoint.name
        )
        return response.status_code, response.json()

    answers = burst(BURST, send)
    statuses = Counter(status for status, _ in answers)
    assert statuses == {202: BURST}, answers
    assert {a["outcome"] for _, a in answers} == {"accepted"}

    reader = Client()

    def read(i: int) -> dict:
        response = reader.get(f"/api/v1/webhooks/deliveries/msg_burst_{i}", **viewer)
        assert response.status_code == 200, response.content
        return response.json()

    def all_settled():
        states = [read(i) for i in range(BURST)]
        return states if all(s["state"] in ("done", "retryable") for s in states) else None

    deliveries = wait_for(all_settled, what="every delivery to reach an outcome")
    wait_for(
        lambda: all(
            r.state in ENDED for r in PolicyRefresh.objects.filter(started_at__isnull=False)
        ),
        what="every started refresh to end",
    )
    refreshes = list(
        PolicyRefresh.objects.filter(source=sim_source, started_at__isnull=False).order_by(
            "started_at"
        )
    )
    found_deadlocks = deadlocks() - deadlocks_before
    outcomes = Counter(d["outcome"] or d["state"] for d in deliveries)
    print(
        f"\n50 concurrent webhooks: HTTP {dict(statuses)}; outcomes {dict(outcomes)}; "
        f"refreshes run {len(refreshes)}; attempts max {max(d['attempts'] for d in deliveries)}; "
        f"PostgreSQL deadlocks {found_deadlocks}"
    )

    assert found_deadlocks == 0
    assert not [d for d in deliveries if "deadlock" in (d["last_error"] or "")]
    # Truthful outcomes: a started delivery names the refresh to its own checkpoint; a
    # superseded one names a later delivery for the same scope.
    by_id = {d["webhook_id"]: d for d in deliveries}
    for i, d in enumerate(deliveries):
        assert d["state"] == "done", d  # nothing was left retryable: every conflict passed
        if d["outcome"] == "started":
            refresh = PolicyRefresh.objects.get(pk=d["refresh_id"])
            assert refresh.target["weight_version"] == f"step-{i}"
        else:
            assert d["outcome"] == "superseded", d
            newer = d["detail"].removeprefix("superseded by webhook ").split()[0]
            assert by_id[newer]["delivery_id"] > d["delivery_id"], (d, by_id[newer])
    # The newest checkpoint is never skipped, and it is what the fleet ends on.
    newest = max(deliveries, key=lambda d: d["delivery_id"])
    assert newest["outcome"] == "started"
    last = PolicyRefresh.objects.get(pk=newest["refresh_id"])
    assert last.state == RefreshState.SUCCEEDED, last.held_reason
    for namespace in NAMESPACES:
        assert gate_state(sim_source, namespace)["verified_version"] == last.weight_version
    # One refresh at a time: the started refreshes ran one after another.
    assert refreshes
    for earlier, later in itertools.pairwise(refreshes):
        assert earlier.finished_at <= later.started_at, (earlier.pk, later.pk)
    assert {r.state for r in refreshes} == {RefreshState.SUCCEEDED}
    # The trainer's repeat of a done delivery is answered from memory and starts nothing.
    before = PolicyRefresh.objects.count()
    i = int(newest["webhook_id"].rsplit("_", 1)[1])
    repeat_status, repeat = send(i)
    assert (repeat_status, repeat["status"]) == (200, "already_processed")
    assert repeat["refresh_id"] == newest["refresh_id"]
    assert PolicyRefresh.objects.count() == before
    assert ReceivedWebhook.objects.count() == BURST


def test_fifty_concurrent_api_plans_and_starts_on_one_scope(sim_source, simfleet):
    # Slow probes make each discovery take a while, as on a real fleet: fifty plans queueing
    # one discovery each would outlast the plan's wait and be blocked for a transient reason.
    # The winner's update fails, so it holds its scope until a person acts, however long the
    # burst takes: every other start must meet it (a winner that finished mid-burst would
    # rightly let a later start through, and the count would depend on timing).
    for worker in simfleet.workers():
        simfleet.inject(worker["key"], "probe", Fault.latency(0.5))
        simfleet.inject(worker["key"], "update_weights_from_disk", Fault.error("held on purpose"))
    operator = bearer_for(Role.OPERATOR, "trainer-bot")
    deadlocks_before = deadlocks()

    def plan_and_start(i: int) -> tuple[int, dict]:
        client = Client()
        target = {"weight_version": f"api-{i}", "model_path": f"/checkpoints/api-{i}"}
        planned = client.post(
            "/api/v1/refreshes",
            {"source": "sim", "target": target},
            content_type="application/json",
            **operator,
        )
        if planned.status_code != 201:
            return planned.status_code, {"plan": planned.json()}
        plan = planned.json()
        started = client.post(f"/api/v1/refreshes/{plan['id']}/start", **operator)
        return started.status_code, {"plan": plan, "start": started.json()}

    answers = burst(BURST, plan_and_start)
    statuses = Counter(status for status, _ in answers)
    found_deadlocks = deadlocks() - deadlocks_before
    blocked = [a["plan"]["plan_blockers"] for _, a in answers if a.get("plan", {}).get("id")]
    blocked = [b for b in blocked if b]
    print(
        f"\n50 concurrent API plan+start: HTTP {dict(sorted(statuses.items()))}; "
        f"409 codes {dict(Counter(a['start']['error']['code'] for s, a in answers if s == 409))}; "
        f"blocked plans {len(blocked)}; PostgreSQL deadlocks {found_deadlocks}"
    )

    assert not [s for s in statuses if s >= 500 or s < 0], Counter(
        a.get("exception", "")[:2000] for _, a in answers
    ).most_common(3)
    assert found_deadlocks == 0
    assert blocked == []  # every plan had a fresh discovery
    winners = [a["start"] for s, a in answers if s == 200]
    assert len(winners) == 1, statuses
    winner = winners[0]
    losers = [a["start"]["error"] for s, a in answers if s == 409]
    assert len(losers) == BURST - 1
    for error in losers:
        assert error["code"] == "refresh_conflict"
        assert error["details"] == {"active_refresh_id": winner["id"]}
        assert f"#{winner['id']}" in error["message"]
    running = PolicyRefresh.objects.exclude(state__in=[RefreshState.PLANNED, *ENDED]).values_list(
        "pk", flat=True
    )
    assert list(running) in ([winner["id"]], [])
    wait_for(
        lambda: PolicyRefresh.objects.filter(pk=winner["id"], state=RefreshState.HELD).first(),
        what="the winning refresh to hold",
    )
    simfleet.clear_faults()
    retried = Client().post(f"/api/v1/refreshes/{winner['id']}/retry", **operator)
    assert retried.status_code == 200, retried.content
    refresh = wait_for(
        lambda: PolicyRefresh.objects.filter(pk=winner["id"], state__in=ENDED).first(),
        what="the winning refresh to end",
    )
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert PolicyRefresh.objects.filter(started_at__isnull=False).count() == 1
