"""The revision history of a source (from the serving ledger) and a rollback through a plan:
to any earlier verified version, of the chosen namespaces, started only from its plan."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from controlplane.refresh import intents
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.intents.recovery import plan_rollback, start_rollback_plan
from controlplane.refresh.models import Gate, GateState, PolicyRefresh, RefreshState
from controlplane.refresh.revisions import revision_history, version_key
from controlplane.simfleet import Fault
from tests.integration.refresh.helpers import (
    actor_for,
    fleet_config,
    make_source,
    run_inline,
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


def versions_in(fleet, namespace):
    return {w["version"] for w in fleet.workers() if w["namespace"] == namespace}


def _held_v3(fleet, source, operator):
    """v1 then v2 verified everywhere; v3 held by a failing update in rl-b."""
    assert run_inline(source, operator, "v1").state == RefreshState.SUCCEEDED
    assert run_inline(source, operator, "v2").state == RefreshState.SUCCEEDED
    bad = keys_in(fleet, "rl-b")[0]
    fleet.inject(bad, "update_weights_from_disk", Fault.error("disk full"))
    held = run_inline(source, operator, "v3")
    assert held.state == RefreshState.HELD
    fleet.clear_faults(bad)
    return held


def test_revision_history_lists_verified_versions_newest_first(fleet, source, operator):
    run_inline(source, operator, "v1")
    run_inline(source, operator, "v2")

    history = revision_history(source)

    assert [r.version for r in history] == ["v2", "v1"]
    assert history[0].current_in == ("rl-a", "rl-b", "rl-c")
    assert history[1].current_in == ()
    assert history[1].policy == {
        "weight_version": "v1",
        "method": "disk",
        "model_path": "/ckpt/v1",
    }
    assert history[1].namespaces == ("rl-a", "rl-b", "rl-c") and history[1].instances == 6


def test_rollback_plan_to_an_older_version_leaves_a_forced_namespace_alone(
    fleet, source, operator, approver
):
    held = _held_v3(fleet, source, operator)
    forced = Gate.objects.get(source=source, namespace="rl-c")
    intents.force_reopen_gate(forced, actor=actor_for(approver), reason="eval run waits")
    execute_refresh(held.pk)  # resumes rl-c's engines, holds again on the rest
    held.refresh_from_db()
    assert held.state == RefreshState.HELD
    rl_c_before = versions_in(fleet, "rl-c")

    plan = plan_rollback(
        source,
        actor=actor_for(operator),
        version=version_key("v1"),
        namespaces=["rl-a", "rl-b"],
        of=held,
    )
    # A plan, not a start: the held refresh still owns its scope until the plan is started.
    assert plan.state == RefreshState.PLANNED and not plan.plan_blockers
    assert plan.target["weight_version"] == "v1" and plan.namespaces == ["rl-a", "rl-b"]
    assert plan.rollback_of_id == held.pk
    held.refresh_from_db()
    assert held.state == RefreshState.HELD

    start_rollback_plan(plan, actor=actor_for(operator))
    execute_refresh(plan.pk)
    plan.refresh_from_db()
    held.refresh_from_db()
    assert plan.state == RefreshState.SUCCEEDED, plan.held_reason
    assert held.state == RefreshState.ROLLED_BACK
    assert versions_in(fleet, "rl-a") == versions_in(fleet, "rl-b") == {"v1"}
    assert versions_in(fleet, "rl-c") == rl_c_before
    assert Gate.objects.get(pk=forced.pk).state == GateState.OPEN_FORCED
    assert revision_history(source)[0].version == "v1"


def test_rollback_plan_must_cover_what_the_held_refresh_still_holds(fleet, source, operator):
    held = _held_v3(fleet, source, operator)
    with pytest.raises(ValidationError, match="still holds rl-c"):
        plan_rollback(
            source,
            actor=actor_for(operator),
            version=version_key("v1"),
            namespaces=["rl-a", "rl-b"],
            of=held,
        )
    with pytest.raises(ValidationError, match="not a verified version"):
        plan_rollback(
            source,
            actor=actor_for(operator),
            version=version_key("v9"),
            namespaces=["rl-a", "rl-b", "rl-c"],
            of=held,
        )
    assert PolicyRefresh.objects.filter(source=source).count() == 3
