"""Cross-cutting guard: a viewer's POST to any page changes nothing and is refused.

Every app has its own permission tests; this one walks the whole URL map so a new mutating
view that forgets its permission check fails here even if its own tests forgot too.
"""

import re

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from controlplane.accounts.tokens import create_token
from controlplane.audit.models import AuditEvent
from controlplane.audit.recorder import Actor
from controlplane.fleet import services as fleet_services
from controlplane.fleet.models import Worker
from controlplane.intake.services import endpoints
from controlplane.notify import services as destinations
from controlplane.refresh.models import Gate, GateState, PolicyRefresh

# Sign-in, the machine-facing API (own auth, tested by its authorization matrix) and static.
SKIP_PREFIXES = ("/accounts/login/", "/accounts/logout/", "/api/", "/static/", "/metrics")


def _patterns(resolver=None, prefix=""):
    for entry in (resolver or get_resolver()).url_patterns:
        if isinstance(entry, URLResolver):
            yield from _patterns(entry, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            yield prefix + str(entry.pattern)


def _concrete(route: str) -> str:
    route = re.sub(r"<int:[^>]+>", "1", route)
    route = re.sub(r"<[^>]+>", "x", route)
    return "/" + route.lstrip("^").rstrip("$")


@pytest.fixture
def one_of_everything(admin_user):
    """pk 1 of every object a URL can point at (sequences reset by the mark below)."""
    actor = Actor.for_user(admin_user)
    source = fleet_services.create_source(
        actor=actor, name="s", listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
    )
    fleet_services.add_static_worker(
        source,
        actor=actor,
        name="sg",
        namespace="ns",
        system_url="http://127.0.0.1:9/",
        family="sglang",
        allowed_routes=["pause_generation"],
    )
    now = timezone.now()
    Worker.objects.create(
        source=source,
        namespace="ns",
        component="c",
        endpoint="rl",
        instance_id="1",
        first_seen_at=now,
        last_seen_at=now,
    )
    refresh = PolicyRefresh.objects.create(
        source=source, namespaces=["ns"], target={"weight_version": "v", "method": "disk"}
    )
    Gate.objects.create(
        source=source, namespace="ns", state=GateState.CLOSED, active_refresh=refresh
    )
    create_token(user=admin_user, label="t", actor=actor)
    endpoints.create_webhook_endpoint(actor=actor, name="e", source=source)
    destinations.create_notification_destination(
        actor=actor,
        name="d",
        kind="webhook",
        url="http://127.0.0.1:9/hook",
        allowed_networks=["127.0.0.0/8"],
    )


@pytest.mark.django_db(transaction=True, reset_sequences=True)
def test_viewer_post_to_every_page_is_refused_and_changes_nothing(one_of_everything, viewer):
    client = Client()
    client.force_login(viewer)
    audit_rows = AuditEvent.objects.count()
    refused = []
    for route in sorted(set(_patterns())):
        path = _concrete(route)
        if path.startswith(SKIP_PREFIXES):
            continue
        response = client.post(path, {"reason": "x", "name": "x", "resume_engines": "1"})
        assert response.status_code in (403, 405), (path, response.status_code)
        refused.append(path)
    assert len(refused) > 25, refused
    assert AuditEvent.objects.count() == audit_rows
    assert PolicyRefresh.objects.get().state == "planned"
    assert not Gate.objects.get().is_open
