"""Notification delivery against a local receiver: signing, retries with backoff, attempt log,
outbound policy."""

import json

from controlplane.notify.delivery import attempt_delivery
from controlplane.notify.emit import notify
from controlplane.notify.models import NotificationDelivery, NotificationDestination
from controlplane.notify.signing import verify
from tests.integration.notify.conftest import SECRET


def _destination(url, allowed_networks=("127.0.0.0/8",), **extra):
    return NotificationDestination.objects.create(
        name="ops",
        kind="webhook",
        url=url,
        secret=SECRET,
        allowed_networks=list(allowed_networks),
        **extra,
    )


def test_delivery_retries_with_backoff_then_succeeds_signed(
    source, receiver, settings, django_capture_on_commit_callbacks
):
    settings.NOTIFICATION_RETRY_BASE_SECONDS = 2.0
    _destination(receiver["url"])
    receiver["script"] = [503, 503]
    with django_capture_on_commit_callbacks(execute=False):
        notify("source.stale", source=source, reason="listener unreachable")
    delivery = NotificationDelivery.objects.get()
    assert attempt_delivery(delivery.pk) == 2.0
    assert attempt_delivery(delivery.pk) == 4.0
    assert attempt_delivery(delivery.pk) is None
    delivery.refresh_from_db()
    assert delivery.status == "delivered" and delivery.attempts == 3
    assert [a.status_code for a in delivery.attempt_log.all()] == [503, 503, 200]
    headers, body = receiver["received"][-1]
    verify([SECRET], headers, body, tolerance_seconds=300)
    assert {h["webhook-id"] for h, _ in receiver["received"]} == {delivery.message_id}
    payload = json.loads(body)
    assert payload["type"] == "source.stale"
    assert payload["data"]["reason"] == "listener unreachable"


def test_delivery_gives_up_after_max_attempts(source, receiver, settings):
    settings.NOTIFICATION_MAX_ATTEMPTS = 2
    _destination(receiver["url"])
    receiver["script"] = [500, 500, 500]
    notify("source.stale", source=source)
    delivery = NotificationDelivery.objects.get()
    assert attempt_delivery(delivery.pk) is not None
    assert attempt_delivery(delivery.pk) is None
    delivery.refresh_from_db()
    assert delivery.status == "failed" and delivery.attempts == 2


def test_destination_outside_its_allowlist_is_never_called(source, receiver):
    _destination(receiver["url"], allowed_networks=["10.0.0.0/8"])
    notify("source.stale", source=source)
    delivery = NotificationDelivery.objects.get()
    assert attempt_delivery(delivery.pk) is None
    delivery.refresh_from_db()
    assert delivery.status == "failed" and "outbound policy" in delivery.last_error
    assert receiver["received"] == []


def test_slack_destinations_get_text(source, receiver):
    NotificationDestination.objects.create(
        name="slack", kind="slack", url=receiver["url"], allowed_networks=["127.0.0.0/8"]
    )
    notify("source.stale", source=source, reason="down")
    attempt_delivery(NotificationDelivery.objects.get().pk)
    _, body = receiver["received"][0]
    assert "Source went stale" in json.loads(body)["text"]


def test_destinations_filter_by_event(source, receiver):
    _destination(receiver["url"], events=["refresh.held"])
    notify("source.stale", source=source)
    assert not NotificationDelivery.objects.exists()
