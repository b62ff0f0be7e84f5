"""Canaries on the simulated fleet: the fingerprint check, verdicts, manual review and expiry."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.audit.models import AuditEvent
from controlplane.audit.recorder import Actor
from controlplane.notify.models import NotificationDelivery, NotificationDestination
from controlplane.refresh import intents
from controlplane.refresh.errors import InvalidTransition
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.intents import canary
from controlplane.refresh.models import JournalEntry, PolicyRefresh, RefreshState
from controlplane.simfleet.tokens import expected_completion_ids
from tests.integration.refresh.helpers import (
    actor_for,
    fleet_versions,
    paused_workers,
    run_inline,
)
from tests.integration.strategy.helpers import gates_of

pytestmark = pytest.mark.django_db

PROMPT = [5, 6, 7, 8]
TRAINER = Actor.system("trainer rl-run-7")


def canary_strategy(evaluation="none", **extra):
    return {
        "kind": "canary",
        "canary": {"size": 2, "evaluation": evaluation, **extra},
        "max_unavailable": 2,
    }


def touched_instances(refresh) -> set[str]:
    return set(
        JournalEntry.objects.filter(refresh=refresh, step="pause").values_list(
            "planned_worker__instance_id", flat=True
        )
    )


def canary_instances(refresh) -> set[str]:
    return set(refresh.workers.filter(wave=1).values_list("instance_id", flat=True))


def test_a_canary_failing_the_fingerprint_rolls_back_only_the_canary_and_holds(
    fleet, source, operator
):
    wrong = expected_completion_ids("v1", PROMPT, 4)  # what the old policy generates
    refresh = run_inline(
        source,
        operator,
        "v2",
        strategy=canary_strategy(),
        fingerprint={"completion_token_ids": wrong},
    )

    assert refresh.state == RefreshState.HELD
    assert "canary failed at verify" in refresh.held_reason
    assert "rolled back to 'v1'" in refresh.held_reason
    assert refresh.failed_step == ""
    canary_ids = canary_instances(refresh)
    assert len(canary_ids) == 2
    # Only the canary was ever paused; every worker serves v1 again, nothing is left paused.
    assert touched_instances(refresh) == canary_ids
    assert set(fleet_versions(fleet).values()) == {"v1"}
    assert paused_workers(fleet) == []
    rolled = JournalEntry.objects.filter(refresh=refresh, step="canary_rollback")
    assert {e.planned_worker.instance_id for e in rolled} == canary_ids
    assert {"pause", "update_from_disk", "get_weight_version", "resume"} <= set(
        rolled.values_list("operation", flat=True)
    )
    # The gate admitted v1 throughout and has all twelve back in its verified set.
    gates = gates_of(source)
    assert all(g.state == "open" and g.verified_version == "v1" for g in gates.values())
    assert sum(len(g.verified_instances) for g in gates.values()) == 12
    assert refresh.progress["canary"]["state"] == "failed"
    # Nothing to retry; rolling the scope back or ending it are the ways out.
    with pytest.raises(InvalidTransition, match="nothing to retry"):
        intents.retry_policy_refresh(refresh, actor=actor_for(operator))
    intents.end_policy_refresh(refresh, actor=actor_for(operator), reason="bad checkpoint")
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.ABORTED


def test_a_canary_passed_by_the_trainers_verdict_proceeds(fleet, source, operator):
    NotificationDestination.objects.create(
        name="trainer", kind="webhook", url="http://127.0.0.1:9/hook", allowed_networks=[]
    )
    refresh = run_inline(source, operator, "v2", strategy=canary_strategy("trainer"))

    assert refresh.state == RefreshState.CANARY_REVIEW
    review = refresh.progress["canary"]
    assert review["state"] == "awaiting"
    shown = {i for ids in review["instances"].values() for i in ids}
    assert shown == canary_instances(refresh)
    # The trainer is told which instances to evaluate.
    delivery = NotificationDelivery.objects.get(event="refresh.canary_review")
    sent = delivery.payload["data"]["refresh"]["canary"]["instances"]
    assert {i for ids in sent.values() for i in ids} == shown
    assert paused_workers(fleet) == []

    canary.record_canary_verdict(
        refresh, passed=True, metrics={"reward": 0.91}, actor=TRAINER, enqueue=False
    )
    # The same verdict again (a retried delivery) changes nothing; the opposite is refused.
    again = canary.record_canary_verdict(
        refresh, passed=True, metrics={"reward": 0.91}, actor=TRAINER, enqueue=False
    )
    assert again.state == RefreshState.PAUSING
    with pytest.raises(InvalidTransition):
        canary.record_canary_verdict(refresh, passed=False, metrics={}, actor=TRAINER)
    execute_refresh(refresh.pk)
    refresh.refresh_from_db()

    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert refresh.progress["canary"]["metrics"] == {"reward": 0.91}
    assert set(fleet_versions(fleet).values()) == {"v2"}
    assert (
        AuditEvent.objects.filter(
            correlation_id=refresh.correlation_id, action="policy_refresh.canary_passed"
        ).count()
        == 1
    )


def test_a_verdict_is_refused_when_no_canary_waits(fleet, source, operator):
    refresh = run_inline(source, operator, "v2", strategy=canary_strategy())
    assert refresh.state == RefreshState.SUCCEEDED
    with pytest.raises(InvalidTransition):
        canary.record_canary_verdict(refresh, passed=True, metrics={}, actor=TRAINER)


def test_a_person_rejecting_the_canary_rolls_it_back(fleet, source, operator):
    refresh = run_inline(source, operator, "v2", strategy=canary_strategy("manual"))
    assert refresh.state == RefreshState.CANARY_REVIEW

    canary.reject_canary(refresh, actor=actor_for(operator), reason="reward regressed")
    execute_refresh(refresh.pk)
    refresh.refresh_from_db()

    assert refresh.state == RefreshState.HELD
    assert "reward regressed" in refresh.held_reason
    assert set(fleet_versions(fleet).values()) == {"v1"}
    assert sum(len(g.verified_instances) for g in gates_of(source).values()) == 12


def test_a_canary_nobody_judges_in_time_is_rolled_back(fleet, source, operator):
    refresh = run_inline(
        source, operator, "v2", strategy=canary_strategy("manual", timeout_seconds=60)
    )
    assert refresh.state == RefreshState.CANARY_REVIEW
    assert canary.expire_canary_reviews() == []  # not yet

    later = timezone.now() + timedelta(seconds=61)
    assert canary.expire_canary_reviews(now=later) == [refresh.pk]
    refresh = PolicyRefresh.objects.get(pk=refresh.pk)
    assert refresh.state == RefreshState.CANARY_ROLLBACK
    execute_refresh(refresh.pk)
    refresh.refresh_from_db()

    assert refresh.state == RefreshState.HELD
    assert "no verdict before the deadline" in refresh.held_reason
    assert set(fleet_versions(fleet).values()) == {"v1"}


def test_named_canary_instances_go_first(fleet, source, operator):
    chosen = sorted(str(w["instance_id"]) for w in fleet.workers())[:2]
    strategy = {
        "kind": "canary",
        "canary": {"instances": chosen, "evaluation": "manual"},
    }
    refresh = run_inline(source, operator, "v2", strategy=strategy)
    assert refresh.state == RefreshState.CANARY_REVIEW
    assert canary_instances(refresh) == set(chosen)
    assert touched_instances(refresh) == set(chosen)
    canary.approve_canary(refresh, actor=actor_for(operator))
