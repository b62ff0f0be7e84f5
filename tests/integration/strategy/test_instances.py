"""An `instances` restriction: only the named instances are refreshed; the rest keep serving
and stay in the gate's verified set."""

from __future__ import annotations

import pytest

from controlplane.refresh.models import JournalEntry, RefreshState
from controlplane.refresh.plansummary import plan_summary
from tests.integration.refresh.helpers import (
    fleet_config,
    fleet_versions,
    make_source,
    plan,
    run_inline,
)
from tests.integration.strategy.helpers import gates_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(simfleet_factory):
    return simfleet_factory(fleet_config(6))


@pytest.fixture
def source(fleet, operator):
    source = make_source(fleet)
    assert run_inline(source, operator, "v1").state == RefreshState.SUCCEEDED
    return source


def two_instances(fleet) -> list[str]:
    return sorted(str(w["instance_id"]) for w in fleet.workers() if w["namespace"] == "rl-a")[:2]


def called(refresh) -> set[str]:
    return set(
        JournalEntry.objects.filter(refresh=refresh)
        .exclude(planned_worker=None)
        .values_list("planned_worker__instance_id", flat=True)
    )


def test_refreshing_named_instances_at_the_gates_version_keeps_every_worker_verified(
    fleet, source, operator
):
    chosen = two_instances(fleet)
    refresh = run_inline(source, operator, "v1", instances=chosen)

    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert called(refresh) == set(chosen)
    gates = gates_of(source)
    assert all(g.state == "open" and g.verified_version == "v1" for g in gates.values())
    assert sum(len(g.verified_instances) for g in gates.values()) == 6


def test_named_instances_moved_to_another_version_stay_outside_the_verified_set(
    fleet, source, operator
):
    chosen = two_instances(fleet)
    refresh = run_inline(source, operator, "v0", instances=chosen)

    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert called(refresh) == set(chosen)
    by_instance = {str(w["instance_id"]): w["version"] for w in fleet.workers()}
    assert {by_instance[i] for i in chosen} == {"v0"}
    assert sorted(v for i, v in by_instance.items() if i not in chosen) == ["v1"] * 4
    gate = gates_of(source)["rl-a"]
    assert gate.state == "open" and gate.verified_version == "v1"
    assert not set(chosen) & set(gate.verified_instances)
    assert gate.active_refresh_id is None
    assert "outside the verified set" in gate.reason
    assert set(fleet_versions(fleet).values()) == {"v0", "v1"}


def test_an_instance_outside_the_scope_blocks_the_plan(fleet, source, operator):
    refresh = plan(source, operator, "v2", instances=["12345"])
    assert any("12345" in b for b in refresh.plan_blockers)


def test_the_plan_summary_names_the_strategy(fleet, source, operator):
    refresh = plan(
        source,
        operator,
        "v2",
        strategy={"kind": "waves", "max_unavailable": 1, "max_failed": 1},
    )
    summary = plan_summary(refresh)
    assert summary.waves == 2 and summary.largest_wave == 3
    assert "waves of at most 1 per namespace" in summary.strategy
    assert "up to 1 worker(s) may fail" in summary.strategy
