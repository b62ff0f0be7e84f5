"""The trace join (issue 23, item 7): every request a policy refresh sends to a worker or the
frontend carries `x-rl-policy-version` (its target version), and each generation check also
`x-rl-rollout-id` and a fresh `x-rl-attempt-id`; the simulated fleet records what it received."""

from __future__ import annotations

import pytest

from controlplane.dynamo.trace_join import (
    ATTEMPT_ID_HEADER,
    POLICY_VERSION_HEADER,
    ROLLOUT_ID_HEADER,
    header_value,
)
from controlplane.refresh import intents
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import RefreshState
from tests.integration.refresh.helpers import actor_for, fleet_config, make_source, plan

pytestmark = pytest.mark.django_db


def _received(fleet) -> list[dict]:
    return fleet.call(lambda: list(fleet.fleet.received_headers))


def test_every_call_of_a_refresh_carries_its_target_version(simfleet_factory, operator):
    fleet = simfleet_factory(fleet_config(4))
    source = make_source(fleet)
    refresh = plan(source, operator, "v2")  # plans after a discovery, whose probes carry none
    intents.start_policy_refresh(refresh, actor=actor_for(operator), enqueue=False)
    fleet.call(fleet.fleet.received_headers.clear)
    execute_refresh(refresh.pk)
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    received = _received(fleet)
    to_workers = [r for r in received if r["server"] != "frontend"]
    engine_calls = [r for r in to_workers if "/engine/" in r["path"]]
    assert engine_calls, received[:5]
    assert [r for r in to_workers if r["headers"].get(POLICY_VERSION_HEADER) != "v2"] == []
    checks = [r for r in received if r["server"] == "frontend" and r["path"] == "/v1/completions"]
    assert checks, "the verify step's generation checks"
    for check in checks:
        assert check["headers"][POLICY_VERSION_HEADER] == "v2"
        assert check["headers"][ROLLOUT_ID_HEADER] == f"refresh-{refresh.pk}"
    attempts = [c["headers"][ATTEMPT_ID_HEADER] for c in checks]
    assert len(set(attempts)) == len(attempts), "one attempt id per request"
    # Only verification requests name a rollout.
    assert all(ROLLOUT_ID_HEADER not in r["headers"] for r in engine_calls)


def test_a_version_from_outside_is_a_safe_header_value():
    assert header_value("step-400") == "step-400"
    assert header_value(400) == "400"
    assert header_value("v\r\nx-evil: 1") == "v\\x0d\\x0ax-evil: 1"
    assert len(header_value("x" * 1000)) == 256
