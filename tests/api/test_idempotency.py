"""Idempotency-Key: replay, mismatch and the concurrent first use."""

import threading

import pytest
from django.db import connection
from django.test import Client

from controlplane.audit.models import AuditEvent
from controlplane.fleet import services
from tests.api.conftest import bearer

URL = "/api/v1/sources/src-a/refresh"


def test_same_key_and_body_returns_the_original_response(fleet, operator_client):
    first = operator_client.post(URL, HTTP_IDEMPOTENCY_KEY="k1")
    again = operator_client.post(URL, HTTP_IDEMPOTENCY_KEY="k1")
    assert first.status_code == again.status_code == 202
    assert again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true"
    assert AuditEvent.objects.filter(action="discovery.requested").count() == 1


def test_same_key_different_request_is_422(fleet, operator_client):
    operator_client.post(URL, HTTP_IDEMPOTENCY_KEY="k2")
    other = operator_client.post("/api/v1/sources/src-b/refresh", HTTP_IDEMPOTENCY_KEY="k2")
    assert other.status_code == 422
    assert other.json()["error"]["code"] == "idempotency_key_reused"


def test_keys_are_scoped_to_the_caller(fleet, operator_client, admin_client):
    operator_client.post(URL, HTTP_IDEMPOTENCY_KEY="shared")
    assert admin_client.post(URL, HTTP_IDEMPOTENCY_KEY="shared").status_code == 202
    assert AuditEvent.objects.filter(action="discovery.requested").count() == 2


def test_a_failed_first_use_can_be_retried_with_the_same_key(fleet, operator_client):
    missing = operator_client.post("/api/v1/sources/nope/refresh", HTTP_IDEMPOTENCY_KEY="k3")
    assert missing.status_code == 404
    assert operator_client.post(URL, HTTP_IDEMPOTENCY_KEY="k3").status_code == 202


@pytest.mark.django_db(transaction=True)
def test_same_key_while_the_first_is_in_flight_is_409(fleet, operator, token_factory, monkeypatch):
    if connection.vendor == "sqlite":
        pytest.skip("needs concurrent writers (PostgreSQL)")
    secret = token_factory(operator, label="racer")
    entered, release = threading.Event(), threading.Event()
    real = services.request_discovery

    def slow(source, *, actor):
        entered.set()
        assert release.wait(10)
        return real(source, actor=actor)

    monkeypatch.setattr(services, "request_discovery", slow)
    results = {}

    def first():
        try:
            results["first"] = Client().post(URL, HTTP_IDEMPOTENCY_KEY="race", **bearer(secret))
        finally:
            connection.close()

    thread = threading.Thread(target=first)
    thread.start()
    assert entered.wait(10)
    second = Client().post(URL, HTTP_IDEMPOTENCY_KEY="race", **bearer(secret))
    release.set()
    thread.join(10)
    assert second.status_code == 409
    assert second.json()["error"]["code"] == "idempotency_key_in_flight"
    assert results["first"].status_code == 202
    third = Client().post(URL, HTTP_IDEMPOTENCY_KEY="race", **bearer(secret))
    assert third.status_code == 202 and third["Idempotent-Replayed"] == "true"
