"""A held refresh of three namespaces is resolved namespace by namespace: force-reopening one
never fails the others' work, "reopen all verified" opens exactly the namespaces whose workers
all passed verify, and no gate is left closed without an action that opens it. The refresh page
says per namespace what its gate is."""

from __future__ import annotations

import json

import pytest

from controlplane.accounts.tokens import create_token
from controlplane.audit.recorder import Actor
from controlplane.refresh import intents
from controlplane.refresh.errors import InvalidTransition
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import (
    Gate,
    GateState,
    RefreshState,
    ScopeLock,
)
from controlplane.refresh.namespaces import verified_namespaces
from controlplane.simfleet import Fault
from tests.integration.refresh.helpers import (
    actor_for,
    fleet_config,
    fleet_versions,
    make_source,
    paused_workers,
    run_inline,
)

pytestmark = pytest.mark.django_db

NAMESPACES = ["rl-a", "rl-b", "rl-c"]
READBACK = "get_weight_version"


@pytest.fixture
def fleet(simfleet_factory):
    return simfleet_factory(fleet_config(6))


@pytest.fixture
def source(fleet):
    return make_source(fleet)


def tokens_in(fleet, namespace):
    return [w["key"] for w in fleet.workers() if w["namespace"] == namespace]


def run(refresh):
    execute_refresh(refresh.pk)
    refresh.refresh_from_db()
    return refresh


def gates(source) -> dict[str, Gate]:
    return {g.namespace: g for g in Gate.objects.filter(source=source)}


def held_at_verify_in_rl_a(fleet, source, operator):
    """rl-a's first worker fails its version readback; rl-b and rl-c pass verify."""
    fleet.inject(tokens_in(fleet, "rl-a")[0], READBACK, Fault.error("readback broken"))
    refresh = run_inline(source, operator, "v2")
    assert refresh.state == RefreshState.HELD and refresh.failed_step == "verify"
    return refresh


def planned_ids(refresh, namespace):
    return sorted(
        refresh.workers.filter(namespace=namespace).values_list("instance_id", flat=True), key=int
    )


def assert_no_gate_stranded(source, approver):
    """Every gate admits, or is closed with a reason by a refresh that is held (which has its
    own recoveries) or by nobody — and then force-reopen opens it."""
    for gate in Gate.objects.filter(source=source):
        if gate.is_open:
            continue
        assert gate.reason, gate
        if gate.active_refresh is not None:
            assert gate.active_refresh.state == RefreshState.HELD, gate
        else:
            intents.force_reopen_gate(gate, actor=actor_for(approver), reason="no gate stranded")
            gate.refresh_from_db()
            assert gate.state == GateState.OPEN_FORCED


def test_reopen_all_verified_opens_exactly_the_verified_namespaces(fleet, source, operator):
    refresh = held_at_verify_in_rl_a(fleet, source, operator)
    assert verified_namespaces(refresh) == ["rl-b", "rl-c"]

    refresh = intents.reopen_verified_namespaces(refresh, actor=actor_for(operator))

    assert refresh.state == RefreshState.HELD  # still held for rl-a
    by_ns = gates(source)
    for namespace in ("rl-b", "rl-c"):
        assert by_ns[namespace].state == GateState.OPEN
        assert by_ns[namespace].verified_version == "v2"
        assert by_ns[namespace].verified_instances == planned_ids(refresh, namespace)
        assert by_ns[namespace].active_refresh_id is None
    assert by_ns["rl-a"].state == GateState.CLOSED
    assert by_ns["rl-a"].active_refresh_id == refresh.pk
    assert "held" in by_ns["rl-a"].reason and "readback broken" in by_ns["rl-a"].reason
    assert set(ScopeLock.objects.filter(source=source).values_list("namespace", flat=True)) == {
        "rl-a"
    }
    # Nothing more to reopen until rl-a passes verify.
    with pytest.raises(InvalidTransition, match="no namespace"):
        intents.reopen_verified_namespaces(refresh, actor=actor_for(operator))

    # The rest is retried once fixed: only rl-a is verified again and opened.
    fleet.clear_faults()
    revisions = {ns: g.revision for ns, g in gates(source).items()}
    intents.retry_policy_refresh(refresh, actor=actor_for(operator))
    refresh = run(refresh)
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    by_ns = gates(source)
    assert by_ns["rl-a"].state == GateState.OPEN
    assert by_ns["rl-a"].verified_instances == planned_ids(refresh, "rl-a")
    assert by_ns["rl-b"].revision == revisions["rl-b"]  # not reopened a second time
    assert not ScopeLock.objects.filter(source=source).exists()


def test_force_reopen_of_one_namespace_never_fails_the_others(
    fleet, source, operator, approver, operator_client
):
    refresh = held_at_verify_in_rl_a(fleet, source, operator)

    intents.force_reopen_gate(
        gates(source)["rl-a"], actor=actor_for(approver), reason="rl-a serves an eval"
    )
    refresh = run(refresh)

    # Only rl-a left the refresh; the others are still held with their own recoveries.
    assert refresh.state == RefreshState.HELD and refresh.failed_step == "verify"
    assert refresh.resolved_namespaces["rl-a"]["outcome"] == "force_reopened"
    by_ns = gates(source)
    assert by_ns["rl-a"].state == GateState.OPEN_FORCED
    assert {by_ns[ns].active_refresh_id for ns in ("rl-b", "rl-c")} == {refresh.pk}
    page = operator_client.get(f"/refreshes/{refresh.pk}/").content.decode()
    assert "The gate stays closed" not in page
    assert 'data-namespace="rl-a" data-state="open_forced"' in page
    assert 'data-namespace="rl-b" data-state="closed"' in page
    assert "open (forced) by" in page and "rl-a serves an eval" in page
    # Identifiers in words, not as stored; a held refresh has not ended, nor is it running.
    assert ">open (forced)</span>" in page and ">force-reopened</small>" in page
    assert ">open_forced<" not in page and ">force_reopened<" not in page
    assert '<dd id="refresh-ended"><span class="muted">not yet: held</span>' in page

    # A retry verifies nothing of rl-a again and opens the verified namespaces.
    intents.retry_policy_refresh(refresh, actor=actor_for(operator))
    refresh = run(refresh)
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    by_ns = gates(source)
    assert by_ns["rl-a"].state == GateState.OPEN_FORCED  # the person's decision stands
    assert [by_ns[ns].state for ns in ("rl-b", "rl-c")] == [GateState.OPEN, GateState.OPEN]
    assert paused_workers(fleet) == []
    assert not ScopeLock.objects.filter(source=source).exists()


def test_a_held_three_namespace_refresh_is_resolved_namespace_by_namespace(
    fleet, source, operator, approver, operator_client
):
    # Held at update in rl-a: every engine is paused, nothing is verified.
    fleet.inject(tokens_in(fleet, "rl-a")[0], "update_weights_from_disk", Fault.error("disk"))
    refresh = run_inline(source, operator, "v2")
    assert refresh.state == RefreshState.HELD and len(paused_workers(fleet)) == 6
    with pytest.raises(InvalidTransition, match="no namespace"):
        intents.reopen_verified_namespaces(refresh, actor=actor_for(operator))

    # rl-b first, through the refresh page: only rl-b's engines run again.
    response = approver_post(
        source, approver, f"/refreshes/{refresh.pk}/force-reopen/", namespace="rl-b"
    )
    assert response.status_code == 302
    refresh = run(refresh)
    assert refresh.state == RefreshState.HELD
    assert set(paused_workers(fleet)) == set(tokens_in(fleet, "rl-a") + tokens_in(fleet, "rl-c"))
    assert_no_gate_stranded(source, approver)

    # The rest is fixed and retried: rl-a and rl-c are updated, verified and opened.
    fleet.clear_faults()
    intents.retry_policy_refresh(refresh, actor=actor_for(operator))
    refresh = run(refresh)
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    by_ns = gates(source)
    assert by_ns["rl-b"].state == GateState.OPEN_FORCED
    assert [by_ns[ns].state for ns in ("rl-a", "rl-c")] == [GateState.OPEN, GateState.OPEN]
    assert paused_workers(fleet) == []
    assert_no_gate_stranded(source, approver)
    # rl-b's workers were never updated after it was closed out; a new refresh fixes them.
    later = run_inline(source, operator, "v3")
    assert later.state == RefreshState.SUCCEEDED, later.held_reason
    assert set(fleet_versions(fleet).values()) == {"v3"}


def test_force_reopen_one_then_abort_the_rest_strands_no_gate(fleet, source, operator, approver):
    refresh = held_at_verify_in_rl_a(fleet, source, operator)
    intents.force_reopen_gate(gates(source)["rl-c"], actor=actor_for(approver), reason="urgent")
    refresh = run(refresh)
    assert refresh.state == RefreshState.HELD

    intents.abort_policy_refresh(refresh, actor=actor_for(operator), resume_engines=True)
    refresh = run(refresh)

    assert refresh.state == RefreshState.ABORTED
    assert paused_workers(fleet) == []
    by_ns = gates(source)
    assert by_ns["rl-c"].state == GateState.OPEN_FORCED
    assert by_ns["rl-a"].state == by_ns["rl-b"].state == GateState.CLOSED
    assert not ScopeLock.objects.filter(source=source).exists()
    assert_no_gate_stranded(source, approver)


def test_reopen_all_verified_then_force_reopen_the_last_ends_the_refresh(
    fleet, source, operator, approver
):
    refresh = held_at_verify_in_rl_a(fleet, source, operator)
    intents.reopen_verified_namespaces(refresh, actor=actor_for(operator))
    intents.force_reopen_gate(gates(source)["rl-a"], actor=actor_for(approver), reason="eval")
    refresh = run(refresh)

    assert refresh.state == RefreshState.FAILED
    assert "rl-a force-reopened" in refresh.end_reason and "rl-b reopened" in refresh.end_reason
    by_ns = gates(source)
    assert by_ns["rl-a"].state == GateState.OPEN_FORCED
    assert [by_ns[ns].state for ns in ("rl-b", "rl-c")] == [GateState.OPEN, GateState.OPEN]
    assert paused_workers(fleet) == []
    assert not ScopeLock.objects.filter(source=source).exists()


def test_the_api_resolves_a_refresh_namespace_by_namespace(fleet, source, operator, approver):
    refresh = held_at_verify_in_rl_a(fleet, source, operator)
    operate = api_client(operator, "op")
    force = api_client(approver, "ap")

    response = operate.post(f"/api/v1/refreshes/{refresh.pk}/reopen-verified")
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "held"
    assert [g.state for g in gates(source).values()] == ["closed", "open", "open"]

    # Forcing needs the force-reopen permission and a namespace of the refresh.
    body = {"namespace": "rl-a", "reason": "eval"}
    denied = operate.post(f"/api/v1/refreshes/{refresh.pk}/force-reopen", body)
    assert denied.status_code == 403
    wrong = force.post(f"/api/v1/refreshes/{refresh.pk}/force-reopen", {**body, "namespace": "x"})
    assert wrong.status_code in (400, 422), wrong.content
    assert gates(source)["rl-a"].state == GateState.CLOSED
    response = force.post(f"/api/v1/refreshes/{refresh.pk}/force-reopen", body)
    assert response.status_code == 200, response.content
    refresh = run(refresh)
    assert refresh.state == RefreshState.FAILED
    assert gates(source)["rl-a"].state == GateState.OPEN_FORCED


# -- clients -----------------------------------------------------------------------------------


def approver_post(source, approver, url, **data):
    from django.test import Client

    client = Client()
    client.force_login(approver)
    return client.post(url, {"reason": "closed out on its own", **data})


class _Api:
    def __init__(self, token: str) -> None:
        from django.test import Client

        self.client = Client()
        self.token = token

    def post(self, url, body=None):
        return self.client.post(
            url,
            json.dumps(body or {}),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {self.token}",
        )


def api_client(user, name) -> _Api:
    _, secret = create_token(user=user, label=name, actor=Actor.system("test"))
    return _Api(secret)
