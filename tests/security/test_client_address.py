"""Who sent a request: X-Forwarded-For counts only from TRUSTED_PROXIES, for /metrics, the
audit's source_ip and the login throttle alike; /metrics takes a bearer token instead when
METRICS_TOKEN is set."""

from __future__ import annotations

import pytest
from django.test import RequestFactory

from controlplane.audit.actions import AuditAction
from controlplane.audit.models import AuditEvent
from controlplane.requests import client_address

PROXY = "10.20.0.2"
OUTSIDE = "203.0.113.9"


@pytest.fixture
def behind_proxy(settings):
    settings.TRUSTED_PROXIES = [PROXY, "10.30.0.0/16"]
    settings.METRICS_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    settings.METRICS_TOKEN = ""
    return settings


def _addr(peer: str, forwarded: str | None = None) -> str | None:
    extra = {"HTTP_X_FORWARDED_FOR": forwarded} if forwarded is not None else {}
    return client_address(RequestFactory().get("/", REMOTE_ADDR=peer, **extra))


@pytest.mark.parametrize(
    ("peer", "forwarded", "expected"),
    [
        (OUTSIDE, "127.0.0.1", OUTSIDE),  # forged by a client that is not a proxy
        (PROXY, OUTSIDE, OUTSIDE),  # the proxy's word
        (PROXY, f"127.0.0.1, {OUTSIDE}", OUTSIDE),  # the client's own prefix is ignored
        (PROXY, f"{OUTSIDE}, 10.30.1.1", OUTSIDE),  # through two trusted proxies
        (PROXY, "10.30.1.1", "10.30.1.1"),  # every hop trusted: the leftmost
        (PROXY, f"{OUTSIDE}, not-an-address", PROXY),  # nothing a proxy wrote: the peer
        (PROXY, None, PROXY),
        ("garbage", "127.0.0.1", None),
    ],
)
def test_client_address_believes_forwarded_for_only_from_trusted_proxies(
    behind_proxy, peer, forwarded, expected
):
    assert _addr(peer, forwarded) == expected


def test_a_forged_forwarded_for_from_a_non_proxy_does_not_open_metrics(client, behind_proxy):
    response = client.get("/metrics", REMOTE_ADDR=OUTSIDE, HTTP_X_FORWARDED_FOR="127.0.0.1")
    assert response.status_code == 403


def test_forwarded_for_from_a_trusted_proxy_is_honoured(client, behind_proxy, db):
    # Loopback via the proxy is served; an outside client via the same proxy is not (before,
    # the proxy's own address decided for everyone behind it).
    behind_proxy.TRUSTED_PROXIES = ["127.0.0.1"]
    local = client.get("/metrics", REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="127.0.0.1")
    assert local.status_code == 200
    outside = client.get("/metrics", REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR=OUTSIDE)
    assert outside.status_code == 403


def test_metrics_bearer_token_is_required_from_every_address(client, behind_proxy, db):
    behind_proxy.METRICS_TOKEN = "scrape-me-0123456789"
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 403
    wrong = client.get(
        "/metrics", REMOTE_ADDR="127.0.0.1", HTTP_AUTHORIZATION="Bearer scrape-me-012345678"
    )
    assert wrong.status_code == 403
    basic = client.get(
        "/metrics", REMOTE_ADDR="127.0.0.1", HTTP_AUTHORIZATION="Basic scrape-me-0123456789"
    )
    assert basic.status_code == 403
    right = client.get(
        "/metrics", REMOTE_ADDR=OUTSIDE, HTTP_AUTHORIZATION="Bearer scrape-me-0123456789"
    )
    assert right.status_code == 200
    assert b"controlplane_workers" in right.content


def test_audit_and_login_throttle_use_the_trusted_client_address(client, behind_proxy, db):
    behind_proxy.LOGIN_THROTTLE_ATTEMPTS = 2
    login = {"username": "nobody", "password": "wrong"}

    def attempt(peer: str, forwarded: str) -> int:
        return client.post(
            "/accounts/login/", login, REMOTE_ADDR=peer, HTTP_X_FORWARDED_FOR=forwarded
        ).status_code

    # Through the proxy: the client's address is recorded and throttled, not the proxy's.
    assert attempt(PROXY, OUTSIDE) == 401
    failed = AuditEvent.objects.filter(action=AuditAction.LOGIN_FAILED).latest("sequence")
    assert failed.source_ip == OUTSIDE
    assert attempt(PROXY, OUTSIDE) == 401
    assert attempt(PROXY, OUTSIDE) == 429
    # Another client behind the same proxy is not locked out by the first one's failures.
    assert attempt(PROXY, "198.51.100.7") == 401
    # A client that is not a proxy cannot dodge its throttle by forging a new address.
    rogue = "192.0.2.50"
    assert attempt(rogue, "198.51.100.8") == 401
    forged = AuditEvent.objects.filter(action=AuditAction.LOGIN_FAILED).latest("sequence")
    assert forged.source_ip == rogue
    assert attempt(rogue, "198.51.100.9") == 401
    assert attempt(rogue, "198.51.100.10") == 429
