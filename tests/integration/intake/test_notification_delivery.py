"""Notification delivery against a local receiver: signing, retries with backoff, attempt log,
outbound policy."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from controlplane.notify.delivery import attempt_delivery
from controlplane.notify.emit import notify
from controlplane.notify.models import NotificationDelivery, NotificationDestination
from controlplane.notify.signing import verify
from tests.integration.intake.conftest import SECRET


@pytest.fixture
def receiver():
    """A local HTTP receiver answering the scripted statuses in order, then 200."""
    state = {"script": [], "received": []}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["content-length"]))
            state["received"].append(({k.lower(): v for k, v in self.headers.items()}, body))
            status = state["script"].pop(0) if state["script"] else 200
            self.send_response(status)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{server.server_port}/hook"
    yield state
    server.shutdown()


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
