"""Webhook endpoint fixtures shared by the intake tests."""

import base64
import json
import time
from pathlib import Path

import pytest

from controlplane.fleet.models import Source
from controlplane.intake.models import WebhookEndpoint
from controlplane.notify.signing import sign_headers

FIXTURES = Path(__file__).resolve().parents[3] / "controlplane/intake/webhooks/trainer/fixtures"
SECRET = "whsec_" + base64.b64encode(b"s" * 32).decode()
OLD_SECRET = "whsec_" + base64.b64encode(b"o" * 32).decode()


def fixture_body(name: str) -> bytes:
    return json.dumps(json.loads((FIXTURES / f"{name}.json").read_text())).encode()


@pytest.fixture
def source(db):
    return Source.objects.create(
        name="src-a", listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
    )


@pytest.fixture
def endpoint(source):
    return WebhookEndpoint.objects.create(name="trainer-a", source=source, secrets=[SECRET])


def post_webhook(
    client,
    body: bytes,
    *,
    secret=SECRET,
    webhook_id="msg_1",
    timestamp=None,
    endpoint="trainer-a",
    headers=None,
):
    signed = sign_headers(secret, webhook_id, body, timestamp=timestamp or int(time.time()))
    if headers is not None:
        signed = headers
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in signed.items()}
    return client.post(
        f"/api/v1/webhooks/trainer/{endpoint}", body, content_type="application/json", **extra
    )
