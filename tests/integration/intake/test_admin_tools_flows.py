"""Admin tools, what each page does: secrets shown once, audited changes, rotation that keeps
trainers working, validation that changes nothing, test events and the delivery log."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.sessions.models import Session
from django.urls import reverse

from controlplane.accounts.models import ApiToken
from controlplane.accounts.tokens import authenticate
from controlplane.audit.models import AuditEvent
from controlplane.audit.recorder import Actor
from controlplane.intake import services
from controlplane.intake.models import ReceivedWebhook, WebhookEndpoint
from controlplane.notify import services as notify_services
from controlplane.notify.delivery import attempt_delivery
from controlplane.notify.models import NotificationDelivery, NotificationDestination
from tests.integration.intake.conftest import fixture_body, post_webhook

SYSTEM = Actor.system("test setup")
TOKEN_SECRET = re.compile(r"cpt_[0-9a-f]{12}_[A-Za-z0-9_-]{43}")
WHSEC = re.compile(r"whsec_[A-Za-z0-9+/=]{40,}")


def audit(action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=action).order_by("sequence"))


def state() -> dict:
    """Everything the admin tools can change, to prove a refused form changed none of it."""
    return {
        "audit": AuditEvent.objects.count(),
        "tokens": ApiToken.objects.count(),
        "endpoints": list(WebhookEndpoint.objects.values()),
        "destinations": list(NotificationDestination.objects.values()),
    }


# -- API tokens ---------------------------------------------------------------------------------


def _shown_once(client, posted, pattern, gone_to: str) -> tuple[str, str]:
    """Post/redirect/get: the POST redirects, the GET shows the secret once (not cached, with a
    copy button), the session store never holds it in clear, and a reload shows it no more."""
    assert posted.status_code == 302 and "no-store" in posted["Cache-Control"]
    shown = client.get(posted["Location"])
    assert shown.status_code == 200 and "no-store" in shown["Cache-Control"]
    body = shown.content.decode()
    secret = pattern.search(body).group(0)
    assert 'data-copy-target="secret"' in body
    for session in Session.objects.all():
        assert secret not in json.dumps(session.get_decoded())
    again = client.get(posted["Location"])
    assert again.status_code == 302 and again["Location"] == gone_to
    follow = client.get(gone_to).content.decode()
    assert secret not in follow and "shown once" in follow
    return secret, body


def test_token_secret_is_shown_once_and_only_its_hash_is_stored(admin_client, viewer, source):
    response = admin_client.post(
        reverse("intake:token_create"),
        {"label": "run-7", "user": viewer.pk, "sources": [source.pk], "expires_days": 30},
    )
    secret, _ = _shown_once(admin_client, response, TOKEN_SECRET, reverse("intake:token_list"))
    token = ApiToken.objects.get(label="run-7")
    assert token.secret_hash == hashlib.sha256(secret.encode()).hexdigest()
    stored = json.dumps(list(ApiToken.objects.values()), default=str)
    assert secret not in stored
    assert authenticate(secret) == token
    # The list never shows it again.
    listing = admin_client.get(reverse("intake:token_list")).content.decode()
    assert secret not in listing and not TOKEN_SECRET.search(listing)
    assert "run-7" in listing and viewer.get_username() in listing and source.name in listing
    (event,) = audit("token.created")
    assert event.actor_label == "admin-1"
    assert event.details["sources"] == [source.name]
    assert secret not in json.dumps(event.details)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"label": "taken"}, "already exists"),
        ({"label": "not a slug"}, "slug"),
        ({"expires_days": 0}, "greater than or equal to 1"),
        ({"user": 999999}, "Select a valid choice"),
    ],
)
def test_bad_token_form_changes_nothing(admin_client, admin_user, change, message):
    services_token = ApiToken.objects.create(
        label="taken", user=admin_user, key_id="000000000000", secret_hash="0" * 64
    )
    before = state()
    form = {"label": "fresh", "user": admin_user.pk, **change}
    response = admin_client.post(reverse("intake:token_create"), form)
    assert response.status_code == 400
    assert message in response.content.decode()
    assert state() == before
    assert services_token.revoked_at is None


def test_revoke_is_audited_and_the_token_stops_working(admin_client, admin_user):
    from controlplane.accounts.tokens import create_token

    token, secret = create_token(user=admin_user, label="bot", actor=SYSTEM)
    response = admin_client.post(reverse("intake:token_revoke", args=[token.pk]))
    assert response.status_code == 302
    assert authenticate(secret) is None
    assert [e.actor_label for e in audit("token.revoked")] == ["admin-1"]
    # Revoking twice records nothing new.
    admin_client.post(reverse("intake:token_revoke", args=[token.pk]))
    assert len(audit("token.revoked")) == 1


# -- webhook endpoints --------------------------------------------------------------------------

ENDPOINT_FORM = {
    "name": "trainer-b",
    "namespaces": "rl-a\nrl-b",
    "policy": "auto_start",
    "rules": '[{"metric": "eval/reward", "op": "lt", "value": 0.2}]',
    "pause_mode": "keep",
    "inflight_may_straddle": "on",
    "enabled": "on",
}


def test_endpoint_create_shows_the_secret_once_and_is_audited(admin_client, source):
    response = admin_client.post(
        reverse("intake:endpoint_create"), {**ENDPOINT_FORM, "source": source.pk}
    )
    endpoint = WebhookEndpoint.objects.get(name="trainer-b")
    page = reverse("intake:endpoint", args=[endpoint.pk])
    secret, body = _shown_once(admin_client, response, WHSEC, page)
    assert "/api/v1/webhooks/trainer/trainer-b" in body and "created" in body
    assert endpoint.secrets == [secret]
    assert endpoint.namespaces == ["rl-a", "rl-b"]
    assert endpoint.rules == [{"metric": "eval/reward", "op": "lt", "value": 0.2}]
    (event,) = audit("webhook_endpoint.created")
    assert event.actor_label == "admin-1"
    assert event.details["secrets"] == [services.secret_fingerprint(secret)]
    assert secret not in json.dumps(event.details)
    detail = admin_client.get(reverse("intake:endpoint", args=[endpoint.pk])).content.decode()
    assert secret not in detail and services.secret_fingerprint(secret) in detail


@pytest.mark.parametrize(
    ("change", "field_message"),
    [
        ({"rules": "[{"}, "not valid JSON"),
        ({"rules": '[{"metric": "m", "op": "eq", "value": 1}]'}, "op must be one of"),
        ({"name": "trainer-a"}, "already exists"),
        ({"namespaces": "rl-a, ../etc"}, "is not a namespace name"),
        ({"policy": "yolo"}, "Select a valid choice"),
    ],
)
def test_bad_endpoint_form_changes_nothing(admin_client, endpoint, change, field_message):
    before = state()
    form = {**ENDPOINT_FORM, "source": endpoint.source_id, **change}
    response = admin_client.post(reverse("intake:endpoint_create"), form)
    assert response.status_code == 400
    assert field_message in response.content.decode()
    assert state() == before


def test_bad_endpoint_edit_changes_nothing(admin_client, endpoint):
    other, _ = services.create_webhook_endpoint(
        actor=SYSTEM, name="trainer-z", source=endpoint.source
    )
    before = state()
    for change in ({"name": "trainer-a"}, {"rules": '{"not": "a list"}'}, {"pause_mode": "x"}):
        form = {**ENDPOINT_FORM, "name": "trainer-z", "source": endpoint.source_id, **change}
        response = admin_client.post(reverse("intake:endpoint_edit", args=[other.pk]), form)
        assert response.status_code == 400, change
    assert state() == before


def test_endpoint_edit_is_audited_with_what_changed(admin_client, endpoint):
    form = {**ENDPOINT_FORM, "name": "trainer-a", "source": endpoint.source_id}
    response = admin_client.post(reverse("intake:endpoint_edit", args=[endpoint.pk]), form)
    assert response.status_code == 302
    endpoint.refresh_from_db()
    assert endpoint.policy == "auto_start"
    (event,) = audit("webhook_endpoint.updated")
    assert event.details["changed"] == [
        "inflight_may_straddle",
        "namespaces",
        "pause_mode",
        "policy",
        "rules",
    ]
    assert event.details["before"]["policy"] == "require_approval"


def test_rotation_keeps_the_old_secret_until_removed(admin_client, client, endpoint):
    old = endpoint.secrets[0]
    response = admin_client.post(reverse("intake:endpoint_rotate", args=[endpoint.pk]))
    page = reverse("intake:endpoint", args=[endpoint.pk])
    new, _ = _shown_once(admin_client, response, WHSEC, page)
    endpoint.refresh_from_db()
    assert endpoint.secrets == [new, old]
    ping = fixture_body("test_ping")
    # Mid-rotation a trainer may sign with either.
    assert post_webhook(client, ping, secret=old, webhook_id="msg_old").status_code == 200
    assert post_webhook(client, ping, secret=new, webhook_id="msg_new").status_code == 200

    admin_client.post(
        reverse("intake:endpoint_remove_secret", args=[endpoint.pk]),
        {"fingerprint": services.secret_fingerprint(old)},
    )
    endpoint.refresh_from_db()
    assert endpoint.secrets == [new]
    assert post_webhook(client, ping, secret=old, webhook_id="msg_old_2").status_code == 401
    assert post_webhook(client, ping, secret=new, webhook_id="msg_new_2").status_code == 200

    added, removed = audit("webhook_endpoint.updated")
    assert added.details["secret_added"] == services.secret_fingerprint(new)
    assert removed.details["secret_removed"] == services.secret_fingerprint(old)
    assert {added.actor_label, removed.actor_label} == {"admin-1"}
    assert old not in json.dumps(added.details) and new not in json.dumps(added.details)


def test_the_last_secret_cannot_be_removed(admin_client, endpoint):
    before = state()
    admin_client.post(
        reverse("intake:endpoint_remove_secret", args=[endpoint.pk]),
        {"fingerprint": services.secret_fingerprint(endpoint.secrets[0])},
    )
    assert state() == before
    endpoint.refresh_from_db()
    assert len(endpoint.secrets) == 1


def test_rotation_stops_at_the_secret_limit(endpoint):
    for _ in range(services.MAX_SECRETS - 1):
        services.add_webhook_secret(endpoint, actor=SYSTEM)
    before = state()
    with pytest.raises(Exception, match="remove an old one"):
        services.add_webhook_secret(endpoint, actor=SYSTEM)
    assert state() == before


def test_endpoint_remove_is_audited_and_trainers_get_404(admin_client, client, endpoint):
    response = admin_client.post(reverse("intake:endpoint_delete", args=[endpoint.pk]))
    assert response.status_code == 302
    assert not WebhookEndpoint.objects.exists()
    (event,) = audit("webhook_endpoint.removed")
    assert event.actor_label == "admin-1" and event.details["name"] == "trainer-a"
    assert post_webhook(client, fixture_body("test_ping")).status_code == 404


def test_send_test_event_records_a_received_delivery(admin_client, endpoint):
    response = admin_client.post(reverse("intake:endpoint_test", args=[endpoint.pk]))
    assert response.status_code == 302
    received = ReceivedWebhook.objects.get(endpoint=endpoint)
    assert received.event_type == "test.ping" and received.outcome == "test"
    assert [e.details["type"] for e in audit("webhook.accepted")] == ["test.ping"]
    page = admin_client.get(reverse("intake:endpoint", args=[endpoint.pk])).content.decode()
    assert received.webhook_id in page


def test_send_test_event_over_htmx_answers_with_the_result_and_the_fresh_log(
    admin_client, endpoint
):
    response = admin_client.post(
        reverse("intake:endpoint_test", args=[endpoint.pk]), HTTP_HX_REQUEST="true"
    )
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<div id="test-result">')
    assert "HTTP 200" in body and 'hx-swap-oob="true"' in body
    assert ReceivedWebhook.objects.get().webhook_id in body


def test_send_test_event_to_a_disabled_endpoint_reports_the_refusal(admin_client, endpoint):
    services.update_webhook_endpoint(endpoint, actor=SYSTEM, enabled=False)
    response = admin_client.post(
        reverse("intake:endpoint_test", args=[endpoint.pk]), HTTP_HX_REQUEST="true"
    )
    assert "HTTP 404" in response.content.decode()
    assert not ReceivedWebhook.objects.exists()


# -- notification destinations ------------------------------------------------------------------

DESTINATION_FORM = {
    "name": "ops",
    "kind": "webhook",
    "url": "http://127.0.0.1:9/hook",
    "allowed_networks": "127.0.0.0/8",
    "events": ["refresh.held", "source.stale"],
    "enabled": "on",
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"url": "http://10.1.2.3/hook"}, "outside this destination"),
        ({"allowed_networks": ""}, "This field is required"),
        ({"allowed_networks": "10.0.0.0/40"}, "invalid CIDR"),
        ({"url": "ftp://127.0.0.1/x"}, "HTTP or HTTPS"),
        ({"url": "http://user:pw@127.0.0.1/x"}, "user information"),
        ({"events": ["nope"]}, "Select a valid choice"),
    ],
)
def test_bad_destination_form_changes_nothing(admin_client, db, change, message):
    before = state()
    response = admin_client.post(
        reverse("intake:destination_create"), {**DESTINATION_FORM, **change}
    )
    assert response.status_code == 400
    assert message in response.content.decode()
    assert state() == before


def test_destination_create_edit_remove_are_audited(admin_client, db):
    response = admin_client.post(reverse("intake:destination_create"), DESTINATION_FORM)
    destination = NotificationDestination.objects.get(name="ops")
    page = reverse("intake:destination", args=[destination.pk])
    secret, _ = _shown_once(admin_client, response, WHSEC, page)
    assert destination.secret == secret
    assert destination.events == ["refresh.held", "source.stale"]

    edit = admin_client.post(
        reverse("intake:destination_edit", args=[destination.pk]),
        {**DESTINATION_FORM, "url": "http://127.0.0.2:9/other", "events": []},
    )
    assert edit.status_code == 302
    # Moving the URL outside the allowlist is refused and leaves the saved one alone.
    refused = admin_client.post(
        reverse("intake:destination_edit", args=[destination.pk]),
        {**DESTINATION_FORM, "url": "http://192.168.0.1/x"},
    )
    assert refused.status_code == 400
    destination.refresh_from_db()
    assert destination.url == "http://127.0.0.2:9/other" and destination.events == []

    admin_client.post(reverse("intake:destination_delete", args=[destination.pk]))
    assert not NotificationDestination.objects.exists()
    actions = [
        e.action
        for e in AuditEvent.objects.filter(action__startswith="notification_destination").order_by(
            "sequence"
        )
    ]
    assert actions == [
        "notification_destination.created",
        "notification_destination.updated",
        "notification_destination.removed",
    ]
    updated = audit("notification_destination.updated")[0]
    assert set(updated.details["changed"]) == {"events", "url_host"}


@pytest.fixture
def receiver():
    """A local receiver answering the scripted statuses in order, then 200."""
    state = {"script": []}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["content-length"]))
            self.send_response(state["script"].pop(0) if state["script"] else 200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{server.server_port}/hook"
    yield state
    server.shutdown()


def test_test_notification_and_its_attempts_show_in_the_delivery_log(
    admin_client, receiver, django_capture_on_commit_callbacks
):
    destination, _ = notify_services.create_notification_destination(
        actor=SYSTEM,
        name="ops",
        kind="webhook",
        url=receiver["url"],
        allowed_networks=["127.0.0.0/8"],
        events=["refresh.held"],
    )
    receiver["script"] = [503]
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = admin_client.post(reverse("intake:destination_test", args=[destination.pk]))
    assert response.status_code == 302
    assert len(callbacks) == 1  # the Celery delivery is enqueued on commit
    # Only this destination, even though `test` would match every destination.
    delivery = NotificationDelivery.objects.get()
    assert delivery.destination == destination and delivery.event == "test"

    assert attempt_delivery(delivery.pk) is not None  # 503: retry scheduled
    page = admin_client.get(reverse("intake:destination", args=[destination.pk]))
    log = page.content.decode()
    delivery.refresh_from_db()
    assert "503" in log and "HTTP 503" in log and "retrying" in log
    assert delivery.next_attempt_at.strftime("%Y-%m-%d %H:%M:%S") in log
    assert 'hx-trigger="every 2s"' in log  # polls while a delivery is unfinished

    assert attempt_delivery(delivery.pk) is None
    partial = admin_client.get(
        reverse("intake:destination", args=[destination.pk]), HTTP_HX_REQUEST="true"
    ).content.decode()
    assert partial.lstrip().startswith('<div id="deliveries"')
    assert "delivered" in partial and "200" in partial
    assert "every 2s" not in partial  # finished: the log stops polling


def test_destination_list_shows_each_destination(admin_client, db):
    for name in ("a", "b"):
        notify_services.create_notification_destination(
            actor=SYSTEM,
            name=name,
            kind="slack",
            url="https://127.0.0.1/services/x",
            allowed_networks=["127.0.0.0/8"],
        )
    body = admin_client.get(reverse("intake:destination_list")).content.decode()
    assert (
        reverse("intake:destination", args=[NotificationDestination.objects.get(name="b").pk])
        in body
    )


def test_a_destination_subscribed_to_stale_sources_hears_from_discovery(
    admin_client, source, django_capture_on_commit_callbacks
):
    # The conftest source's listener is port 9 on loopback, where nothing answers.
    from controlplane.fleet.discovery import run_discovery
    from controlplane.fleet.models import DiscoveryTrigger

    admin_client.post(
        reverse("intake:destination_create"),
        {**DESTINATION_FORM, "events": ["source.stale"], "source": source.pk},
    )
    with django_capture_on_commit_callbacks(execute=False):
        run = run_discovery(source.pk, trigger=DiscoveryTrigger.MANUAL)
        run_discovery(source.pk, trigger=DiscoveryTrigger.MANUAL, wait=5)
    assert not run.ok
    # Once when it went stale, not again while it stays stale.
    delivery = NotificationDelivery.objects.get()
    assert delivery.event == "source.stale"
    assert delivery.payload["data"]["source"]["name"] == source.name
    assert delivery.payload["data"]["reason"] == run.error


def test_list_pages_cost_the_same_queries_for_one_or_many_rows(admin_client, admin_user, source):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from controlplane.accounts.tokens import create_token

    def make(i: int) -> None:
        create_token(user=admin_user, label=f"t{i}", actor=SYSTEM, sources=[source])
        services.create_webhook_endpoint(actor=SYSTEM, name=f"e{i}", source=source)
        notify_services.create_notification_destination(
            actor=SYSTEM,
            name=f"d{i}",
            kind="slack",
            url="http://127.0.0.1/x",
            allowed_networks=["127.0.0.0/8"],
            source=source,
        )
        # Every delivery (with its attempts) goes to the first destination, whose log we read.
        delivery = NotificationDelivery.objects.create(
            destination=NotificationDestination.objects.get(name="d0"), event="test"
        )
        delivery.attempt_log.create(number=1, attempted_at=delivery.created_at, error="x")

    def costs() -> list[int]:
        first = NotificationDestination.objects.get(name="d0")
        counts = []
        for url in (
            reverse("intake:token_list"),
            reverse("intake:endpoint_list"),
            reverse("intake:destination_list"),
            reverse("intake:destination", args=[first.pk]),
        ):
            with CaptureQueriesContext(connection) as ctx:
                assert admin_client.get(url).status_code == 200
            counts.append(len(ctx.captured_queries))
        return counts

    make(0)
    one = costs()
    for i in range(1, 6):
        make(i)
    assert costs() == one
