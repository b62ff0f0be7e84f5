"""Hostile JSON at every input that takes JSON: a validly signed webhook, every unsafe API
endpoint, the admin forms' JSON fields and worker replies. Deep nesting (100,000 `[`), NaN and
Infinity get a clear 4xx in the standard error shape (or a recorded error) and change nothing.
"""

from __future__ import annotations

import re

import pytest
from django.apps import apps
from django.test import Client

from controlplane.audit.models import AuditEvent
from controlplane.dynamo.admin import decode_body
from controlplane.dynamo.jsonsafe import UnsafeJSON, loads_bounded
from controlplane.intake.api.site import api
from controlplane.intake.models import ReceivedWebhook, WebhookEndpoint
from tests.integration.intake.conftest import SECRET, post_webhook

DEEP = b"[" * 100_000
BARELY_TOO_DEEP = b'{"a":' * 65 + b"1" + b"}" * 65
HOSTILE = {
    "deep": DEEP,
    "barely_too_deep": BARELY_TOO_DEEP,
    "nan": b'{"source": "src-a", "target": {"weight_version": NaN}}',
    "infinity": b'{"reason": -Infinity, "resume_engines": 1e999}',
}


def snapshot() -> dict[str, int]:
    """Row counts of every table of ours: "nothing changed" means none of them moved."""
    return {
        model._meta.label: model.objects.count()
        for model in apps.get_models()
        if model._meta.app_label in ("fleet", "refresh", "intake", "notify", "audit", "accounts")
        and not model._meta.proxy
        and model._meta.managed
    }


def assert_error_shape(response, status: int = 400) -> dict:
    assert response.status_code == status, response.content[:300]
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "details"}
    return body["error"]


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_signed_webhook_with_hostile_json_is_refused_and_stores_nothing(db, name):
    from controlplane.fleet.models import Source

    source = Source.objects.create(
        name="src-a", listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
    )
    WebhookEndpoint.objects.create(name="trainer-a", source=source, secrets=[SECRET])
    response = post_webhook(Client(), HOSTILE[name], webhook_id=f"msg_{name}")
    error = assert_error_shape(response)
    assert error["code"] in ("json_too_deep", "invalid_json")
    assert not ReceivedWebhook.objects.exists()
    (rejected,) = AuditEvent.objects.filter(action="webhook.rejected")
    assert rejected.details["code"] == error["code"]


def _unsafe_operations() -> list[tuple[str, str]]:
    schema = api.get_openapi_schema(path_prefix="/api/v1")
    return sorted(
        (method.upper(), path)
        for path, operations in schema["paths"].items()
        for method in operations
        if method in ("post", "put", "patch", "delete") and "/webhooks/trainer/" not in path
    )


UNSAFE_OPERATIONS = _unsafe_operations()


def test_every_unsafe_api_operation_is_listed():
    # The parametrised test below must cover the API's real surface, not a stale list.
    assert ("POST", "/api/v1/refreshes") in UNSAFE_OPERATIONS
    assert ("POST", "/api/v1/refreshes/{refresh_id}/start") in UNSAFE_OPERATIONS
    assert len(UNSAFE_OPERATIONS) >= 8


@pytest.mark.parametrize("kind", ["deep", "nan"])
@pytest.mark.parametrize(("method", "path"), UNSAFE_OPERATIONS)
def test_hostile_json_at_every_unsafe_api_endpoint_is_a_400_and_changes_nothing(
    admin_client, fleet, method, path, kind
):
    values = {
        "refresh_id": fleet["refresh"].pk,
        "source": "src-a",
        "name": "src-a",
        "namespace": "rl-a",
        "worker_id": fleet["worker"].pk,
        "gate_id": fleet["gate"].pk,
    }
    url = re.sub(r"\{(\w+)\}", lambda m: str(values.get(m.group(1), 1)), path)
    before = snapshot()
    response = admin_client.generic(method, url, HOSTILE[kind], content_type="application/json")
    error = assert_error_shape(response)
    assert error["code"] == ("json_too_deep" if kind == "deep" else "invalid_json")
    assert snapshot() == before


def test_bounded_parser_refuses_what_json_loads_accepts_or_crashes_on():
    for data in (DEEP, BARELY_TOO_DEEP, b"[NaN]", b"[Infinity]", b"[-1e400]", b"\xff"):
        with pytest.raises(UnsafeJSON):
            loads_bounded(data)
    with pytest.raises(UnsafeJSON, match="over 10 bytes"):
        loads_bounded(b"[" + b"1," * 10 + b"1]", max_bytes=10)
    # Brackets inside strings are text, not nesting.
    assert loads_bounded(b'{"a": "' + b"[" * 1000 + b'"}') == {"a": "[" * 1000}
    assert loads_bounded(b"[" * 64 + b"]" * 64) is not None


def test_worker_replies_with_hostile_json_are_kept_as_text_not_parsed():
    # The journal stores what the worker said; a reply that is not acceptable JSON stays text
    # (no family counts text as success), instead of crashing the executor or the jsonb column.
    for raw in (DEEP, b'{"status": "ok", "v": NaN}', b'{"status": "ok", "v": 1e999}'):
        assert isinstance(decode_body(raw), str)
    assert decode_body(b'{"status": "ok"}') == {"status": "ok"}


def test_endpoint_form_rules_with_deep_json_are_a_form_error(admin_client, fleet):
    before = snapshot()
    response = admin_client.post(
        "/admin-tools/webhooks/new/",
        {
            "name": "deep-rules",
            "source": fleet["a"].pk,
            "policy": "auto_start",
            "pause_mode": "keep",
            "rules": "[" * 100_000,
        },
    )
    assert response.status_code in (200, 400)
    assert b"JSON" in response.content
    assert snapshot() == before
