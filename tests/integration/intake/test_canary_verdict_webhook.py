"""`canary.verdict` over a signed webhook: refused (and audited) when the version is not the
refresh's, when no canary waits, for another source's refresh and for bad data; a verdict is
recorded once, with the delivery's outcome; a checkpoint naming its own strategy is refused
unless the endpoint allows it."""

import json

import pytest

from controlplane.audit.models import AuditEvent
from controlplane.fleet.models import Source
from controlplane.intake.models import ReceivedWebhook
from controlplane.refresh.models import PolicyRefresh, RefreshState
from tests.integration.intake.conftest import post_webhook

pytestmark = pytest.mark.django_db


def verdict(data) -> bytes:
    return json.dumps({"type": "canary.verdict", "data": data}).encode()


def awaiting(source, state=RefreshState.CANARY_REVIEW) -> PolicyRefresh:
    return PolicyRefresh.objects.create(
        source=source,
        namespaces=["rl-a"],
        target={"weight_version": "v5", "method": "disk", "model_path": "/m"},
        state=state,
        strategy={"kind": "canary", "canary": {"size": 1, "evaluation": "trainer"}},
        waves=2,
        progress={"canary": {"state": "awaiting", "evaluation": "trainer", "instances": {}}},
    )


def rejected_codes() -> list[str]:
    return [e.details["code"] for e in AuditEvent.objects.filter(action="webhook.rejected")]


def test_a_verdict_on_another_version_is_refused_and_changes_nothing(client, endpoint, source):
    refresh = awaiting(source)
    answer = post_webhook(
        client, verdict({"refresh_id": refresh.pk, "weight_version": "v4", "passed": False})
    )
    assert answer.status_code == 409, answer.content
    assert "another checkpoint" in answer.json()["error"]["message"]
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.CANARY_REVIEW
    assert refresh.progress["canary"]["state"] == "awaiting"
    assert rejected_codes() == ["invalid_transition"]
    assert not ReceivedWebhook.objects.exists()


def test_a_verdict_when_no_canary_waits_is_refused(client, endpoint, source):
    refresh = awaiting(source, state=RefreshState.HELD)
    answer = post_webhook(
        client, verdict({"refresh_id": refresh.pk, "weight_version": "v5", "passed": True})
    )
    assert answer.status_code == 409


def test_another_sources_refresh_is_unknown(client, endpoint):
    other = Source.objects.create(name="other", listener_url="http://127.0.0.1:9/")
    refresh = awaiting(other)
    answer = post_webhook(
        client, verdict({"refresh_id": refresh.pk, "weight_version": "v5", "passed": True})
    )
    assert answer.status_code == 404
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.CANARY_REVIEW


@pytest.mark.parametrize(
    "data",
    [
        {"weight_version": "v5", "passed": "yes"},  # not a boolean
        {"weight_version": "v5"},  # no verdict
        {"passed": True},  # no version
        {"weight_version": "v5", "passed": True, "extra": 1},
    ],
)
def test_bad_verdict_data_is_refused(client, endpoint, source, data):
    refresh = awaiting(source)
    answer = post_webhook(client, verdict({"refresh_id": refresh.pk, **data}))
    assert answer.status_code == 422
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.CANARY_REVIEW


def test_a_failing_verdict_is_recorded_once_with_its_outcome(client, endpoint, source):
    refresh = awaiting(source)
    body = verdict(
        {
            "refresh_id": refresh.pk,
            "weight_version": "v5",
            "passed": False,
            "metrics": {"eval/reward": 0.12},
            "reason": "reward fell",
        }
    )
    first = post_webhook(client, body, webhook_id="msg_v1")
    assert first.status_code == 200, first.content
    assert first.json()["canary"]["verdict"] == "failed"
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.CANARY_ROLLBACK
    assert "reward fell" in refresh.held_reason
    assert refresh.progress["canary"]["metrics"] == {"eval/reward": 0.12}
    stored = ReceivedWebhook.objects.get()
    assert (stored.outcome, stored.refresh_id, stored.state) == (
        "canary_verdict",
        refresh.pk,
        "done",
    )

    again = post_webhook(client, body, webhook_id="msg_v1")
    assert again.status_code == 200
    assert again.json()["status"] == "already_processed"
    assert ReceivedWebhook.objects.count() == 1
    failed = AuditEvent.objects.filter(action="policy_refresh.canary_failed")
    assert [e.actor_label for e in failed] == ["webhook:trainer-a"]


def checkpoint(strategy) -> bytes:
    return json.dumps(
        {
            "type": "checkpoint.ready",
            "data": {"weight_version": "v6", "model_path": "/m", "strategy": strategy},
        }
    ).encode()


def test_a_checkpoint_naming_a_strategy_is_refused_unless_the_endpoint_allows_it(client, endpoint):
    answer = post_webhook(client, checkpoint({"kind": "waves", "max_unavailable": 2}))
    assert answer.status_code == 403
    assert answer.json()["error"]["code"] == "strategy_override_not_allowed"
    assert not ReceivedWebhook.objects.exists()


def test_an_invalid_strategy_override_names_its_field(client, endpoint):
    endpoint.allow_strategy_override = True
    endpoint.save()
    answer = post_webhook(client, checkpoint({"kind": "waves", "max_unavailable": "150%"}))
    assert answer.status_code == 422
    details = answer.json()["error"]["details"]
    assert list(details) == ["data.strategy.max_unavailable"]
    assert not ReceivedWebhook.objects.exists()

    allowed = post_webhook(
        client, checkpoint({"kind": "waves", "max_unavailable": 2}), webhook_id="msg_ok"
    )
    assert allowed.status_code == 202, allowed.content
