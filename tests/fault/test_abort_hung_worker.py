"""An abort takes effect now, even with a worker hung in its update.

A real Celery worker runs the refresh on the simulated fleet; one worker's update hangs (far
past the call timeout). The abort comes from the page, the JSON API or the command line; the
refresh must reach `aborted` within `ABORT_WITHIN_SECONDS` of the abort — not when the hung
call times out — and the journal must say the hung call was cancelled after its request had
reached the worker.
"""

from __future__ import annotations

import json
import time

import pytest

from controlplane.refresh import intents
from controlplane.refresh.models import (
    Gate,
    JournalEntry,
    PolicyRefresh,
    RefreshState,
    ScopeLock,
    StepRun,
    WorkerStepResult,
)
from controlplane.simfleet import Fault
from tests.integration.refresh.cli import cli
from tests.integration.refresh.helpers import (
    actor_for,
    fleet_config,
    make_source,
    paused_workers,
    plan,
    wait_for,
)

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]

UPDATE_ROUTE = "update_weights_from_disk"
WORKERS = 4
#: The done-criterion of issue 27: the step ends within 2 s of the abort.
ABORT_WITHIN_SECONDS = 2.0
#: The call timeout the hung update would otherwise run to.
CALL_TIMEOUT_SECONDS = 30.0


def hung_mid_update(simfleet_factory, operator, settings, name: str):
    """A refresh running on the Celery worker with one worker hung in its update (the others
    done with theirs): returns the refresh, the fleet and the hung worker's key."""
    settings.REFRESH_CALL_TIMEOUT_SECONDS = CALL_TIMEOUT_SECONDS
    fleet = simfleet_factory(fleet_config(WORKERS))
    refresh = plan(make_source(fleet, name=name), operator, "v2")
    assert not refresh.plan_blockers, refresh.plan_blockers
    hung = fleet.workers()[0]["key"]
    fleet.inject(hung, UPDATE_ROUTE, Fault.hang(600, once=True))
    intents.start_policy_refresh(refresh, actor=actor_for(operator))
    # The fault is used up once the hung worker's update request has arrived and hangs.
    wait_for(lambda: UPDATE_ROUTE not in fleet.state(hung)["faults"], timeout=30)
    wait_for(
        lambda: (
            WorkerStepResult.objects.filter(refresh=refresh, step="update", status="ok").count()
            == WORKERS - 1
        ),
        timeout=30,
    )
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.UPDATING, refresh.state
    return refresh, fleet, hung


def aborted_within(refresh, started: float) -> float:
    wait_for(
        lambda: PolicyRefresh.objects.filter(pk=refresh.pk, state=RefreshState.ABORTED).exists(),
        timeout=CALL_TIMEOUT_SECONDS,
    )
    return time.monotonic() - started


def assert_cancelled_and_reported(refresh, fleet, hung: str, operator) -> None:
    refresh.refresh_from_db()
    # The one call cancelled is the hung worker's: every other update answered.
    cancelled = JournalEntry.objects.get(refresh=refresh, step="update", cancelled=True)
    assert cancelled.reached is True and not cancelled.ok and cancelled.http_status is None
    assert "reached the worker" in cancelled.error
    results = WorkerStepResult.objects.filter(refresh=refresh, step="update")
    assert sorted(results.values_list("status", flat=True)) == ["cancelled"] + ["ok"] * (
        WORKERS - 1
    )
    assert results.get(status="cancelled").planned_worker_id == cancelled.planned_worker_id
    assert fleet.state(hung)["update_count"] == 0  # still hanging, or dropped with the call
    step = StepRun.objects.get(refresh=refresh, name="update")
    assert step.status == "aborted"
    assert step.detail == (
        f"aborted by {actor_for(operator).label}: 1 call cancelled (1 had reached the worker)"
    )
    assert step.duration_ms < CALL_TIMEOUT_SECONDS * 1000
    # Its scope is free for what follows; the gates stay closed; what it paused stays paused
    # and is named.
    assert not ScopeLock.objects.filter(refresh=refresh).exists()
    assert not any(g.is_open for g in Gate.objects.filter(source=refresh.source))
    assert f"{WORKERS} workers this refresh paused left paused" in refresh.end_reason
    assert len(paused_workers(fleet)) == WORKERS


@pytest.mark.parametrize("via", ["page", "api"])
def test_an_abort_cancels_a_hung_update_within_two_seconds(
    simfleet_factory, operator, operator_client, celery_worker, settings, fault_report, via
):
    refresh, fleet, hung = hung_mid_update(simfleet_factory, operator, settings, f"hung-{via}")
    started = time.monotonic()
    if via == "page":
        answer = operator_client.post(f"/refreshes/{refresh.pk}/abort/")
        assert answer.status_code in (200, 302), answer.status_code
    else:
        answer = operator_client.post(
            f"/api/v1/refreshes/{refresh.pk}/abort", json.dumps({}), "application/json"
        )
        assert answer.status_code == 200, answer.content
        # Answered at once, before the executor confirms.
        assert answer.json()["state"] in ("aborting", "aborted")
    took = aborted_within(refresh, started)
    fault_report(via=via, abort_to_aborted_s=round(took, 2), call_timeout_s=CALL_TIMEOUT_SECONDS)
    assert took < ABORT_WITHIN_SECONDS, took
    assert_cancelled_and_reported(refresh, fleet, hung, operator)


def test_the_command_line_abort_returns_at_once_and_watch_waits_for_aborted(
    simfleet_factory, operator, celery_worker, settings, fault_report
):
    refresh, fleet, hung = hung_mid_update(simfleet_factory, operator, settings, "hung-cli")
    started = time.monotonic()
    code, out, err = cli(
        "refresh", "abort", str(refresh.pk), "--as", operator.username, "--watch", "--interval",
        "0.05",
    )  # fmt: skip
    took = time.monotonic() - started
    fault_report(via="cli", abort_to_aborted_s=round(took, 2))
    assert code == 0, (out, err)
    assert f"Policy refresh #{refresh.pk} is now aborting" in out
    assert out.strip().splitlines()[-1].startswith(f"policy refresh #{refresh.pk} aborted: ")
    assert took < ABORT_WITHIN_SECONDS, took
    assert_cancelled_and_reported(refresh, fleet, hung, operator)
