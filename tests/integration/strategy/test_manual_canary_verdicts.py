"""A canary with `evaluation: manual` is judged by a person: the trainer's signed
`canary.verdict` webhook and a trainer-scoped token on `POST …/canary_verdict` are refused
(409), audited, and move nothing; the refresh keeps waiting and the approver's button on the
refresh page still passes it. Runs on the simulated fleet with real PostgreSQL."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.urls import reverse

from controlplane.accounts.tokens import create_token
from controlplane.audit.models import AuditEvent
from controlplane.audit.recorder import Actor
from controlplane.intake.models import ReceivedWebhook, WebhookEndpoint
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import PolicyRefresh, RefreshState
from tests.integration.intake.conftest import SECRET, post_webhook
from tests.integration.refresh.helpers import fleet_versions, paused_workers, run_inline

pytestmark = pytest.mark.django_db

MANUAL = {
    "kind": "canary",
    "canary": {"size": 2, "evaluation": "manual", "timeout_seconds": 600},
    "max_unavailable": 2,
}


def verdict_body(refresh: PolicyRefresh, passed: bool = True) -> bytes:
    data = {"refresh_id": refresh.pk, "weight_version": "v2", "passed": passed}
    return json.dumps({"type": "canary.verdict", "data": data}).encode()


def still_waiting(refresh: PolicyRefresh, fleet, canary_ids: set[str]) -> None:
    """Nothing moved: the canary waits for a person, only it serves v2, nothing is paused."""
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.CANARY_REVIEW
    review = refresh.progress["canary"]
    assert review["state"] == "awaiting" and "verdict" not in review
    versions = fleet_versions(fleet)
    assert {i for i, v in versions.items() if v == "v2"} == canary_ids
    assert paused_workers(fleet) == []
    assert not AuditEvent.objects.filter(
        correlation_id=refresh.correlation_id,
        action__in=("policy_refresh.canary_passed", "policy_refresh.canary_failed"),
    ).exists()


def test_a_manual_canary_refuses_the_trainers_verdict_and_waits_for_a_person(
    fleet, source, operator
):
    refresh = run_inline(source, operator, "v2", strategy=MANUAL)
    assert refresh.state == RefreshState.CANARY_REVIEW, refresh.held_reason
    canary_ids = set(refresh.workers.filter(wave=1).values_list("key", flat=True))
    assert len(canary_ids) == 2

    # 1. The signed webhook: 409 with the reason, the delivery stored with its refusal.
    WebhookEndpoint.objects.create(name="trainer-a", source=source, secrets=[SECRET])
    answer = post_webhook(Client(), verdict_body(refresh), webhook_id="msg_verdict_manual")
    assert answer.status_code == 409, answer.content
    error = answer.json()["error"]
    assert error["code"] == "canary_not_trainer_judged"
    assert "judged by a person" in error["message"]
    delivery = ReceivedWebhook.objects.get(webhook_id="msg_verdict_manual")
    assert delivery.state == "done"
    assert delivery.detail.startswith("refused: ") and "evaluation manual" in delivery.detail
    assert delivery.refresh_id == refresh.pk
    still_waiting(refresh, fleet, canary_ids)
    # A repeat of the same delivery is answered from it and still moves nothing.
    again = post_webhook(Client(), verdict_body(refresh), webhook_id="msg_verdict_manual")
    assert again.status_code == 200 and again.json()["status"] == "already_processed"
    assert again.json()["detail"] == delivery.detail
    still_waiting(refresh, fleet, canary_ids)

    # 2. A trainer-scoped token on the API: 409 in the project's error shape.
    _, secret = create_token(user=operator, label="trainer", actor=Actor.system(), sources=[source])
    api = Client().post(
        f"/api/v1/refreshes/{refresh.pk}/canary_verdict",
        {"weight_version": "v2", "passed": True},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {secret}",
    )
    assert api.status_code == 409, api.content
    assert api.json()["error"]["code"] == "canary_not_trainer_judged"
    still_waiting(refresh, fleet, canary_ids)
    refused = AuditEvent.objects.filter(
        correlation_id=refresh.correlation_id, action="policy_refresh.canary_verdict_refused"
    )
    assert sorted(e.actor_label for e in refused) == [
        f"token:trainer ({operator.get_username()})",
        "webhook:trainer-a",
    ]

    # 3. The approver's button on the refresh page still passes it; the rest follows.
    page = Client()
    page.force_login(operator)
    clicked = page.post(reverse("refresh:approve_canary", args=[refresh.pk]), {"reason": "ok"})
    assert clicked.status_code == 302
    refresh.refresh_from_db()
    assert refresh.progress["canary"]["verdict"] == "passed"
    assert refresh.progress["canary"]["by"] == operator.get_username()
    execute_refresh(refresh.pk)
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert set(fleet_versions(fleet).values()) == {"v2"}
