"""Actions and webhooks accepted while the task queue (Redis) is down: the answer tells the
truth about the committed change instead of a 500, and the work runs once Redis is back,
recovered from the database's own rows (reconciler, delivery sweep) by a real Celery worker
and its beat, never by a person."""

from __future__ import annotations

import pytest

from controlplane.refresh.models import EXECUTING_STATES, PolicyRefresh, RefreshState
from tests.fixtures.broker import killable_redis, product_on, wait_until, worker_process
from tests.integration.refresh.helpers import fleet_config, make_source, plan

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]

FINISHED = {RefreshState.SUCCEEDED, RefreshState.HELD, RefreshState.FAILED, RefreshState.ABORTED}


@pytest.fixture
def redis_server(tmp_path):
    with killable_redis(tmp_path / "redis") as server:
        yield server


def test_start_with_the_broker_down_answers_its_committed_state_and_runs_once_it_is_back(
    simfleet_factory, operator, operator_client, redis_server, settings, tmp_path
):
    fleet = simfleet_factory(fleet_config(4))
    refresh = plan(make_source(fleet), operator, "v2")
    assert not refresh.plan_blockers, refresh.plan_blockers
    settings.REFRESH_LEASE_SECONDS = 2.0
    settings.RECONCILE_TICK_SECONDS = 1.0
    with product_on(redis_server, settings):
        redis_server.kill()
        response = operator_client.post(f"/api/v1/refreshes/{refresh.pk}/start")

        assert response.status_code == 200, response.content
        body = response.json()
        refresh.refresh_from_db()
        assert refresh.state in EXECUTING_STATES  # the start committed
        assert body["state"] == refresh.state
        assert body["queued"] is False
        assert body["recovery"] == (
            "the task queue was unavailable; the reconciler enqueues the refresh within 3 s "
            "of the queue's return"
        )

        redis_server.start()
        with worker_process(
            redis_server.url,
            tmp_path / "worker.log",
            beat=True,
            REFRESH_LEASE_SECONDS="2",
            RECONCILE_TICK_SECONDS="1",
        ):
            done = wait_until(
                lambda: PolicyRefresh.objects.filter(pk=refresh.pk, state__in=FINISHED).first(),
                timeout=60,
                what="the reconciler to run the started refresh",
            )
    assert done.state == RefreshState.SUCCEEDED, done.held_reason
    assert {fleet.state(w["key"])["version"] for w in fleet.workers()} == {"v2"}


def test_start_with_the_broker_up_says_it_was_queued(
    simfleet_factory, operator, operator_client, redis_server, settings, tmp_path
):
    fleet = simfleet_factory(fleet_config(2))
    refresh = plan(make_source(fleet), operator, "v2")
    with product_on(redis_server, settings):
        response = operator_client.post(f"/api/v1/refreshes/{refresh.pk}/start")
    assert response.status_code == 200, response.content
    assert response.json()["queued"] is True
    assert response.json()["recovery"] is None
