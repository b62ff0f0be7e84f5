"""Ten thousand forged or tampered trainer webhooks, none accepted.

Generated from a fixed seed (reproducible). Every forgery starts from a genuinely signed
delivery and breaks one thing an attacker or a careless network could: the secret, one bit of
the body or signature, the timestamp window, a header, the endpoint, or the body under a
replayed id.

Where each one is judged decides how it is sent. `receive` looks the endpoint up and then calls
`verify` with that endpoint's secrets before it reads anything else, so every forgery the
signature check refuses (all of them: a replayed id sent with another body no longer matches its
signature) is checked against `verify` directly, with the endpoint looked up the same way: that
costs microseconds, where the whole path writes an audit row into the hash chain. A
representative share of every kind (`THROUGH_HTTP` each) is also posted to the real URL, so the
whole path, audit row included, is proven on each kind of forgery.
"""

from __future__ import annotations

import base64
import json
import random
import time
from collections import Counter

from django.conf import settings

from controlplane.audit.actions import AuditAction
from controlplane.audit.models import AuditEvent
from controlplane.intake.models import ReceivedWebhook, WebhookEndpoint
from controlplane.intake.webhooks.trainer.receive import receive
from controlplane.notify.signing import VerificationError, sign, verify
from controlplane.refresh.models import PolicyRefresh
from tests.integration.intake.conftest import OLD_SECRET, SECRET, post_webhook

FORGERIES = 10_000
SEED = 20261130
#: Forgeries of each kind posted to the real URL (the whole path, audit row included).
THROUGH_HTTP = 30


def checkpoint(rng: random.Random) -> bytes:
    step = rng.randrange(1, 10**6)
    return json.dumps(
        {
            "type": "checkpoint.ready",
            "data": {"weight_version": f"step-{step}", "model_path": f"/ckpt/{step}"},
        }
    ).encode()


def headers(webhook_id: str, ts: int, signature: str) -> dict[str, str]:
    return {"webhook-id": webhook_id, "webhook-timestamp": str(ts), "webhook-signature": signature}


def flip_bit(data: bytes, rng: random.Random) -> bytes:
    flipped = bytearray(data)
    flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
    return bytes(flipped)


def forge(kind: str, rng: random.Random, genuine_id: str, genuine_body: bytes):
    """One forged (endpoint, headers, body) of the given kind."""
    now = int(time.time())
    body = checkpoint(rng)
    msg = f"msg_forged_{rng.getrandbits(64):x}"
    good = sign(SECRET, msg, now, body)
    if kind == "wrong_secret":
        secret = "whsec_" + base64.b64encode(rng.randbytes(32)).decode()
        return "trainer-a", headers(msg, now, sign(secret, msg, now, body)), body
    if kind == "old_secret":  # a secret rotated out
        return "trainer-a", headers(msg, now, sign(OLD_SECRET, msg, now, body)), body
    if kind == "flipped_body":
        return "trainer-a", headers(msg, now, good), flip_bit(body, rng)
    if kind == "flipped_signature":
        raw = flip_bit(base64.b64decode(good[3:]), rng)
        return "trainer-a", headers(msg, now, "v1," + base64.b64encode(raw).decode()), body
    if kind == "truncated_signature":
        return "trainer-a", headers(msg, now, good[: rng.randrange(3, len(good) - 1)]), body
    if kind == "replayed_id_other_body":
        # The id of a delivery that was accepted, its signature, a different body.
        sig = sign(SECRET, genuine_id, now, genuine_body)
        return "trainer-a", headers(genuine_id, now, sig), body
    if kind == "stale_timestamp":
        ts = now - rng.randrange(301, 10**7)
        return "trainer-a", headers(msg, ts, sign(SECRET, msg, ts, body)), body
    if kind == "future_timestamp":
        ts = now + rng.randrange(301, 10**7)
        return "trainer-a", headers(msg, ts, sign(SECRET, msg, ts, body)), body
    if kind == "shifted_timestamp":  # signed for one time, sent with another
        return "trainer-a", headers(msg, now - rng.randrange(1, 200), good), body
    if kind == "missing_headers":
        sent = headers(msg, now, good)
        for name in rng.sample(sorted(sent), rng.randrange(1, 4)):
            del sent[name]
        return "trainer-a", sent, body
    if kind == "wrong_scheme":
        return "trainer-a", headers(msg, now, "v2" + good[2:]), body
    if kind == "other_endpoint":  # signed for trainer-a, sent to trainer-b (its own secret)
        return "trainer-b", headers(msg, now, good), body
    if kind == "unknown_endpoint":
        return f"nope-{rng.randrange(10**6)}", headers(msg, now, good), body
    raise AssertionError(kind)


KINDS = (
    "wrong_secret",
    "old_secret",
    "flipped_body",
    "flipped_signature",
    "truncated_signature",
    "replayed_id_other_body",
    "stale_timestamp",
    "future_timestamp",
    "shifted_timestamp",
    "missing_headers",
    "wrong_scheme",
    "other_endpoint",
    "unknown_endpoint",
)


def _judged_by_the_verifier(endpoint_name, sent_headers, body, endpoints) -> str:
    """What `receive` answers before it reads the body, done the same way: the enabled endpoint
    by name (an unknown one is refused), then `verify` with its secrets and tolerance. Returns
    the refusal code; "verified" when the signature holds."""
    if endpoint_name not in endpoints:
        endpoints[endpoint_name] = WebhookEndpoint.objects.filter(
            name=endpoint_name, enabled=True
        ).first()
    endpoint = endpoints[endpoint_name]
    if endpoint is None:
        return "unknown_endpoint"
    try:
        verify(
            endpoint.secrets,
            sent_headers,
            body,
            tolerance_seconds=settings.WEBHOOK_TOLERANCE_SECONDS,
        )
    except VerificationError as exc:
        return exc.code
    return "verified"


def test_ten_thousand_forged_webhooks_are_all_refused(source, client):
    WebhookEndpoint.objects.create(name="trainer-a", source=source, secrets=[SECRET])
    other_secret = "whsec_" + base64.b64encode(b"b" * 32).decode()
    WebhookEndpoint.objects.create(name="trainer-b", source=source, secrets=[other_secret])
    rng = random.Random(SEED)

    # One genuine delivery, so "replayed id" forgeries have a real id to aim at.
    genuine_id, genuine_body = "msg_genuine", checkpoint(rng)
    now = int(time.time())
    genuine = receive(
        "trainer-a", headers(genuine_id, now, sign(SECRET, genuine_id, now, genuine_body)),
        genuine_body,
    )  # fmt: skip
    assert genuine.status == 202, genuine.body
    rejected_before = AuditEvent.objects.filter(action=AuditAction.WEBHOOK_REJECTED).count()

    forgeries = [
        (kind, *forge(kind, rng, genuine_id, genuine_body))
        for kind in (KINDS[i % len(KINDS)] for i in range(FORGERIES))
    ]
    accepted, codes, statuses, sent_whole_way = [], Counter(), Counter(), Counter()
    endpoints: dict = {}
    t0 = time.perf_counter()
    for kind, endpoint, sent_headers, body in forgeries:
        code = _judged_by_the_verifier(endpoint, sent_headers, body, endpoints)
        codes[code] += 1
        if code == "verified":
            accepted.append((kind, "verifier", code))
        if sent_whole_way[kind] < THROUGH_HTTP:
            sent_whole_way[kind] += 1
            response = post_webhook(client, body, endpoint=endpoint, headers=sent_headers)
            statuses[response.status_code] += 1
            if response.status_code < 400:
                accepted.append((kind, response.status_code, response.json()))
    elapsed = time.perf_counter() - t0

    whole_way = sum(sent_whole_way.values())
    print(
        f"\nforged webhooks: {FORGERIES} sent, {len(accepted)} accepted; verifier codes "
        f"{dict(sorted(codes.items()))}; {whole_way} through the whole path (statuses "
        f"{dict(sorted(statuses.items()))}); {FORGERIES / elapsed:.0f}/s"
    )
    assert accepted == []
    # Every kind went the whole way THROUGH_HTTP times.
    assert sent_whole_way == dict.fromkeys(KINDS, THROUGH_HTTP)
    # Every refusal on the whole path was audited; only the genuine delivery was stored;
    # nothing was planned.
    rejected = AuditEvent.objects.filter(action=AuditAction.WEBHOOK_REJECTED).count()
    assert rejected - rejected_before == whole_way
    assert list(ReceivedWebhook.objects.values_list("webhook_id", flat=True)) == [genuine_id]
    assert not PolicyRefresh.objects.exists()
