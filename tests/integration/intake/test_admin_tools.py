"""Admin tools: who may open and change what. Every view for each of {anonymous, viewer, operator,
approver, admin}; refused requests must also leave everything as it was."""

from __future__ import annotations

import pytest
from django.urls import reverse

from controlplane.accounts.models import ApiToken
from controlplane.accounts.tokens import create_token
from controlplane.audit.models import AuditEvent
from controlplane.audit.recorder import Actor
from controlplane.intake import services
from controlplane.intake.models import ReceivedWebhook, WebhookEndpoint
from controlplane.notify import services as notify_services
from controlplane.notify.models import NotificationDelivery

SYSTEM = Actor.system("test setup")


@pytest.fixture
def objects(source, admin_user):
    endpoint, _ = services.create_webhook_endpoint(actor=SYSTEM, name="trainer-a", source=source)
    services.add_webhook_secret(endpoint, actor=SYSTEM)
    destination, _ = notify_services.create_notification_destination(
        actor=SYSTEM,
        name="ops",
        kind="webhook",
        url="http://127.0.0.1:9/hook",
        allowed_networks=["127.0.0.0/8"],
    )
    token, _ = create_token(user=admin_user, label="bot", actor=SYSTEM)
    return {"endpoint": endpoint, "destination": destination, "token": token}


def pages(o) -> list[str]:
    """Every GET page of the admin tools."""
    e, d = o["endpoint"].pk, o["destination"].pk
    return [
        reverse("intake:admin_index"),
        reverse("intake:token_list"),
        reverse("intake:token_create"),
        reverse("intake:endpoint_list"),
        reverse("intake:endpoint_create"),
        reverse("intake:endpoint", args=[e]),
        reverse("intake:endpoint_edit", args=[e]),
        reverse("intake:endpoint_delete", args=[e]),
        reverse("intake:destination_list"),
        reverse("intake:destination_create"),
        reverse("intake:destination", args=[d]),
        reverse("intake:destination_edit", args=[d]),
        reverse("intake:destination_delete", args=[d]),
    ]


def mutations(o) -> list[str]:
    """Every view that changes something (all POST)."""
    e, d, t = o["endpoint"].pk, o["destination"].pk, o["token"].pk
    return [
        reverse("intake:token_create"),
        reverse("intake:token_revoke", args=[t]),
        reverse("intake:endpoint_create"),
        reverse("intake:endpoint_edit", args=[e]),
        reverse("intake:endpoint_rotate", args=[e]),
        reverse("intake:endpoint_remove_secret", args=[e]),
        reverse("intake:endpoint_test", args=[e]),
        reverse("intake:endpoint_delete", args=[e]),
        reverse("intake:destination_create"),
        reverse("intake:destination_edit", args=[d]),
        reverse("intake:destination_secret", args=[d]),
        reverse("intake:destination_test", args=[d]),
        reverse("intake:destination_delete", args=[d]),
    ]


def snapshot(o) -> dict:
    endpoint = WebhookEndpoint.objects.filter(pk=o["endpoint"].pk).first()
    return {
        "audit": AuditEvent.objects.count(),
        "secrets": endpoint.secrets if endpoint else None,
        "tokens": list(ApiToken.objects.values_list("label", "revoked_at")),
        "received": ReceivedWebhook.objects.count(),
        "deliveries": NotificationDelivery.objects.count(),
    }


def test_anonymous_is_sent_to_login_everywhere(client, objects):
    for url in pages(objects):
        response = client.get(url)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"], url
    before = snapshot(objects)
    for url in mutations(objects):
        response = client.post(url, {"fingerprint": "x", "label": "x", "name": "x"})
        assert response.status_code == 302 and "/accounts/login/" in response["Location"], url
    assert snapshot(objects) == before


@pytest.mark.parametrize("persona", ["viewer_client", "operator_client", "approver_client"])
def test_non_admins_get_403_on_every_page_and_change_nothing(request, persona, objects):
    client = request.getfixturevalue(persona)
    for url in pages(objects):
        assert client.get(url).status_code == 403, url
    before = snapshot(objects)
    for url in mutations(objects):
        assert client.post(url, {"fingerprint": "x"}).status_code == 403, url
    assert snapshot(objects) == before


def test_non_admins_do_not_see_the_admin_link(viewer_client, admin_client):
    assert 'href="/admin-tools/"' not in viewer_client.get("/").content.decode()
    assert 'href="/admin-tools/"' in admin_client.get("/").content.decode()


def test_admin_opens_every_page(admin_client, objects):
    for url in pages(objects):
        assert admin_client.get(url).status_code == 200, url


def test_mutating_views_refuse_get(admin_client, objects):
    # GET must never change anything: the POST-only views answer 405, the form views show a form.
    before = snapshot(objects)
    for url in mutations(objects):
        assert admin_client.get(url).status_code in (200, 405), url
    assert snapshot(objects) == before


def test_mutations_need_a_csrf_token(admin_user, objects):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    before = snapshot(objects)
    for url in mutations(objects):
        assert client.post(url).status_code == 403, url
    assert snapshot(objects) == before


def test_admin_post_only_views_act(admin_client, objects):
    o = objects
    rotate = admin_client.post(reverse("intake:endpoint_rotate", args=[o["endpoint"].pk]))
    assert rotate.status_code == 302  # to the page showing the new secret once
    tested = admin_client.post(reverse("intake:endpoint_test", args=[o["endpoint"].pk]))
    assert tested.status_code == 302
    queued = admin_client.post(reverse("intake:destination_test", args=[o["destination"].pk]))
    assert queued.status_code == 302
    revoked = admin_client.post(reverse("intake:token_revoke", args=[o["token"].pk]))
    assert revoked.status_code == 302
    secret = admin_client.post(reverse("intake:destination_secret", args=[o["destination"].pk]))
    assert secret.status_code == 302  # to the page showing it once
    assert ReceivedWebhook.objects.filter(event_type="test.ping").count() == 1
    assert NotificationDelivery.objects.filter(event="test").count() == 1
    assert ApiToken.objects.get(pk=o["token"].pk).revoked_at is not None


def test_index_links_sources_tokens_webhooks_and_destinations(admin_client, source):
    body = admin_client.get(reverse("intake:admin_index")).content.decode()
    for url in (
        reverse("fleet:source_create"),
        reverse("fleet:source", args=[source.pk]),
        reverse("fleet:source_edit", args=[source.pk]),
        reverse("intake:token_list"),
        reverse("intake:endpoint_list"),
        reverse("intake:destination_list"),
    ):
        assert f'href="{url}"' in body, url


@pytest.mark.parametrize("persona", ["viewer", "operator", "approver"])
def test_the_pages_showing_a_new_secret_are_for_admins_only(request, persona, objects):
    client = request.getfixturevalue(f"{persona}_client")
    o = objects
    for url in (
        reverse("intake:token_created", args=[o["token"].pk]),
        reverse("intake:endpoint_secret_shown", args=[o["endpoint"].pk]),
        reverse("intake:destination_secret_shown", args=[o["destination"].pk]),
    ):
        assert client.get(url).status_code == 403, url
