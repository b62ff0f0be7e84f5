"""Redis killed (-9) in the middle of a policy refresh's update step, under a real Celery worker
process running the refresh on the simulated fleet, then brought back: the refresh ends
`succeeded` (on its own executor, or resumed by the reconciler from its journal), no refresh is
held by the transient fault, and no worker is left paused without a refresh that owns it."""

from __future__ import annotations

import time

import pytest

from controlplane.refresh import intents
from controlplane.refresh.models import ACTIVE_STATES, PolicyRefresh, RefreshState
from controlplane.simfleet import Fault
from tests.fixtures.broker import killable_redis, product_on, wait_until, worker_process
from tests.integration.refresh.helpers import (
    actor_for,
    fleet_config,
    make_source,
    paused_workers,
    plan,
)

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]

UPDATE_ROUTE = "update_weights_from_disk"
#: Each worker's update takes this long, so Redis dies while the step is running (and the
#: executor's task is unacked: it acks late) and stays away past the step's end.
UPDATE_SECONDS = 3.0
OUTAGE_SECONDS = 6.0
FINISHED = {RefreshState.SUCCEEDED, RefreshState.HELD, RefreshState.FAILED, RefreshState.ABORTED}


@pytest.fixture
def redis_server(tmp_path):
    with killable_redis(tmp_path / "redis") as server:
        yield server


def test_redis_killed_mid_update_step_the_refresh_still_succeeds(
    simfleet_factory, operator, redis_server, settings, tmp_path, fault_report
):
    fleet = simfleet_factory(fleet_config(4))
    refresh = plan(make_source(fleet), operator, "v2")
    assert not refresh.plan_blockers, refresh.plan_blockers
    for worker in fleet.workers():
        fleet.inject(worker["key"], UPDATE_ROUTE, Fault.latency(UPDATE_SECONDS, once=True))
    with (
        product_on(redis_server, settings),
        worker_process(
            redis_server.url,
            tmp_path / "worker.log",
            beat=True,
            REFRESH_LEASE_SECONDS="5",
            RECONCILE_TICK_SECONDS="1",
        ) as worker,
    ):
        intents.start_policy_refresh(refresh, actor=actor_for(operator))
        wait_until(
            lambda: PolicyRefresh.objects.filter(
                pk=refresh.pk, state=RefreshState.UPDATING
            ).exists(),
            timeout=30,
            what="the refresh to reach its update step",
        )
        redis_server.kill()
        killed_in = PolicyRefresh.objects.get(pk=refresh.pk).state
        time.sleep(OUTAGE_SECONDS)  # the outage itself: nothing to poll for
        redis_server.start()
        back = time.monotonic()
        done = wait_until(
            lambda: PolicyRefresh.objects.filter(pk=refresh.pk, state__in=FINISHED).first(),
            timeout=60,
            what="the refresh to end",
        )
        ended_in = round(time.monotonic() - back, 1)
        # The worker used to exit here: "Unrecoverable error: AttributeError" from kombu.
        assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-4000:]
    log = (tmp_path / "worker.log").read_text()
    assert "Unrecoverable error" not in log, log[-4000:]

    held = PolicyRefresh.objects.filter(state=RefreshState.HELD).count()
    owned = PolicyRefresh.objects.filter(state__in=ACTIVE_STATES).exists()
    unowned_paused = [] if owned else paused_workers(fleet)
    fault_report(
        killed_in=killed_in,
        final_state=done.state,
        held_by_transient=held,
        paused_without_owner=len(unowned_paused),
        ended_after_return_s=ended_in,
    )
    assert done.state == RefreshState.SUCCEEDED, (done.state, done.held_reason)
    assert held == 0
    assert unowned_paused == []
    assert {fleet.state(w["key"])["version"] for w in fleet.workers()} == {"v2"}
