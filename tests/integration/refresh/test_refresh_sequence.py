"""A policy refresh over a simulated fleet: the happy path and every injected fault."""

from __future__ import annotations

import pytest

from controlplane.audit.models import AuditEvent
from controlplane.refresh.models import Gate, JournalEntry, RefreshState, WorkerStepResult
from controlplane.simfleet import Fault
from tests.integration.refresh.helpers import (
    NAMESPACES,
    fleet_config,
    fleet_versions,
    make_source,
    paused_workers,
    run_inline,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(simfleet_factory):
    return simfleet_factory(fleet_config(12))


@pytest.fixture
def source(fleet):
    return make_source(fleet)


def gates_of(source):
    return {g.namespace: g for g in Gate.objects.filter(source=source)}


def test_twelve_workers_across_three_namespaces_move_to_the_new_version(fleet, source, operator):
    refresh = run_inline(source, operator, "v2")

    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert set(refresh.namespaces) == set(NAMESPACES)
    assert set(fleet_versions(fleet).values()) == {"v2"}
    assert paused_workers(fleet) == []
    gates = gates_of(source)
    assert set(gates) == set(NAMESPACES)
    assert all(g.is_open and g.verified_version == "v2" for g in gates.values())
    # Every worker passed every worker step; flush is skipped with the family's reason.
    results = WorkerStepResult.objects.filter(refresh=refresh)
    assert results.filter(step="verify", status="ok").count() == 12
    flush = results.filter(step="flush")
    assert {r.status for r in flush} == {"skipped"}
    assert "already invalidates the prefix cache" in flush.first().error
    ops = set(JournalEntry.objects.filter(refresh=refresh).values_list("operation", flat=True))
    assert {"pause", "update_from_disk", "resume", "get_weight_version", "generation"} <= ops
    pinned = JournalEntry.objects.filter(refresh=refresh, operation="generation").first()
    assert pinned.request_body["nvext"]["backend_instance_id"] == int(
        pinned.planned_worker.instance_id
    )
    actions = set(
        AuditEvent.objects.filter(correlation_id=refresh.correlation_id).values_list(
            "action", flat=True
        )
    )
    assert {"policy_refresh.started", "policy_refresh.succeeded", "gate.closed"} <= actions


def first_key(fleet, namespace="rl-b"):
    return next(w["key"] for w in fleet.workers() if w["namespace"] == namespace)


def assert_held(refresh, source, step, reason_part):
    assert refresh.state == RefreshState.HELD
    assert refresh.failed_step == step
    assert reason_part in refresh.held_reason
    assert not any(g.is_open for g in gates_of(source).values())


def test_update_error_on_one_worker_holds_with_the_gate_closed(fleet, source, operator):
    bad = first_key(fleet)
    fleet.inject(bad, "update_weights_from_disk", Fault.error("disk full"))
    refresh = run_inline(source, operator)
    assert_held(refresh, source, "update", "disk full")
    failed = WorkerStepResult.objects.get(refresh=refresh, step="update", status="failed")
    assert failed.planned_worker.instance_id == str(fleet.state(bad)["instance_id"])


def test_flush_error_holds(fleet, source, operator):
    fleet.inject(first_key(fleet), "flush_cache", Fault.http(500, "kaboom"))
    refresh = run_inline(source, operator, flush_policy="always")
    assert_held(refresh, source, "flush", "kaboom")


def test_silently_reverting_version_fails_verification(fleet, source, operator):
    fleet.inject(first_key(fleet), "update_weights_from_disk", Fault.revert_version())
    refresh = run_inline(source, operator)
    assert_held(refresh, source, "verify", "version readback")


def test_hang_past_the_call_timeout_holds(fleet, source, operator, settings):
    settings.REFRESH_CALL_TIMEOUT_SECONDS = 0.5
    fleet.inject(first_key(fleet), "pause_generation", Fault.hang(5))
    refresh = run_inline(source, operator)
    assert_held(refresh, source, "pause", "timed out after 0.5s")


def test_generation_check_failure_holds(fleet, source, operator):
    fleet.inject(first_key(fleet), "generate", Fault.cancel())
    refresh = run_inline(source, operator)
    assert_held(refresh, source, "verify", "generation")
