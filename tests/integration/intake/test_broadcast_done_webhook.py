"""`broadcast.done` over a signed webhook: refused for another source's refresh, for namespaces
outside the endpoint, for bad data, and when the refresh is not waiting for a broadcast."""

import json

import pytest

from controlplane.fleet.models import Source
from controlplane.intake.models import ReceivedWebhook
from controlplane.refresh.models import PolicyRefresh
from tests.integration.intake.conftest import post_webhook

pytestmark = pytest.mark.django_db


def body(data) -> bytes:
    return json.dumps({"type": "broadcast.done", "data": data}).encode()


def refresh_on(source, namespaces=("rl-a",), state="updating", group_state="ready"):
    return PolicyRefresh.objects.create(
        source=source,
        namespaces=list(namespaces),
        target={"weight_version": "v5", "method": "distributed"},
        state=state,
        group={"state": group_state, "world_size": 3},
    )


def test_another_sources_refresh_is_unknown(client, endpoint):
    other = Source.objects.create(name="other", listener_url="http://127.0.0.1:9/")
    refresh = refresh_on(other)
    answer = post_webhook(client, body({"refresh_id": refresh.pk}))
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "unknown_refresh"
    refresh.refresh_from_db()
    assert refresh.group["state"] == "ready"
    assert not ReceivedWebhook.objects.exists()


def test_namespaces_outside_the_endpoint_are_refused(client, endpoint, source):
    endpoint.namespaces = ["rl-b"]
    endpoint.save()
    answer = post_webhook(client, body({"refresh_id": refresh_on(source).pk}))
    assert answer.status_code == 403


def test_bad_data_is_refused(client, endpoint):
    answer = post_webhook(client, body({"refresh_id": "x", "extra": 1}))
    assert answer.status_code == 422


def test_a_refresh_not_waiting_for_a_broadcast_answers_409(client, endpoint, source):
    refresh = refresh_on(source, group_state="joining")
    answer = post_webhook(client, body({"refresh_id": refresh.pk}))
    assert answer.status_code == 409
    assert "not waiting for a broadcast" in answer.json()["error"]["message"]


def test_the_report_is_recorded_once(client, endpoint, source):
    refresh = refresh_on(source)
    first = post_webhook(client, body({"refresh_id": refresh.pk, "weight_version": "v5"}))
    assert first.status_code == 200, first.json()
    assert first.json()["group"]["state"] == "broadcast_done", first.json()
    refresh.refresh_from_db()
    assert refresh.group["broadcast_done_by"] == "webhook:trainer-a"
    stored = ReceivedWebhook.objects.get()
    assert stored.outcome == "broadcast_done" and stored.refresh_id is None
