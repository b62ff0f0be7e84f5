"""The admin "send test" buttons are attributed: who pressed them, on what, with what result."""

from __future__ import annotations

import pytest
from django.urls import reverse

from controlplane.audit.models import AuditEvent
from controlplane.audit.recorder import Actor
from controlplane.intake import services
from controlplane.intake.models import ReceivedWebhook
from controlplane.notify import services as notify_services
from controlplane.notify.models import NotificationDelivery

SYSTEM = Actor.system("test setup")


def audit(action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=action).order_by("sequence"))


@pytest.fixture
def destination(db):
    destination, _ = notify_services.create_notification_destination(
        actor=SYSTEM,
        name="ops",
        kind="webhook",
        url="http://127.0.0.1:9/hook",
        allowed_networks=["127.0.0.0/8"],
        events=["refresh.held"],
    )
    return destination


def test_endpoint_test_event_is_attributed_to_the_admin(admin_client, admin_user, endpoint):
    response = admin_client.post(reverse("intake:endpoint_test", args=[endpoint.pk]))
    assert response.status_code == 302

    (event,) = audit("webhook_endpoint.test_sent")
    assert (event.actor_type, event.actor_user_id, event.actor_label) == (
        "user",
        admin_user.pk,
        "admin-1",
    )
    assert (event.target_type, event.target_id) == ("intake.webhookendpoint", str(endpoint.pk))
    received = ReceivedWebhook.objects.get(endpoint=endpoint)
    assert event.details == {
        "name": "trainer-a",
        "status": 200,
        "outcome": "test",
        "error": None,
        "webhook_id": received.webhook_id,
    }
    # The webhook's own row (actor: the webhook) and the admin's row belong to one request.
    (accepted,) = audit("webhook.accepted")
    assert accepted.actor_type == "webhook"
    assert event.correlation_id and event.correlation_id == accepted.correlation_id


def test_a_refused_endpoint_test_event_is_still_attributed_with_the_refusal(
    admin_client, admin_user, endpoint
):
    services.update_webhook_endpoint(endpoint, actor=SYSTEM, enabled=False)
    admin_client.post(reverse("intake:endpoint_test", args=[endpoint.pk]), HTTP_HX_REQUEST="true")

    (event,) = audit("webhook_endpoint.test_sent")
    assert event.actor_user_id == admin_user.pk
    assert event.details["status"] == 404
    (rejected,) = audit("webhook.rejected")
    assert event.details["error"] == rejected.details["code"]
    assert not ReceivedWebhook.objects.exists()


def test_endpoint_test_by_a_non_admin_is_refused_and_not_recorded(operator_client, endpoint):
    response = operator_client.post(reverse("intake:endpoint_test", args=[endpoint.pk]))
    assert response.status_code == 403
    assert audit("webhook_endpoint.test_sent") == []


def test_destination_test_notification_is_attributed_to_the_admin(
    admin_client, admin_user, destination, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False):
        response = admin_client.post(reverse("intake:destination_test", args=[destination.pk]))
    assert response.status_code == 302

    (event,) = audit("notification_destination.test_sent")
    assert (event.actor_type, event.actor_user_id, event.actor_label) == (
        "user",
        admin_user.pk,
        "admin-1",
    )
    assert (event.target_type, event.target_id) == (
        "intake.notificationdestination",
        str(destination.pk),
    )
    delivery = NotificationDelivery.objects.get()
    assert event.details == {"name": "ops", "delivery_id": delivery.pk}


def test_a_disabled_destination_sends_nothing_and_records_nothing(
    admin_client, destination, django_capture_on_commit_callbacks
):
    notify_services.update_notification_destination(destination, actor=SYSTEM, enabled=False)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        admin_client.post(reverse("intake:destination_test", args=[destination.pk]))
    assert callbacks == []
    assert not NotificationDelivery.objects.exists()
    assert audit("notification_destination.test_sent") == []
