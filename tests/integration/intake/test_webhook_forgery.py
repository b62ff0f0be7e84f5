"""Ten thousand forged or tampered trainer webhooks, none accepted.

Generated from a fixed seed (reproducible), through the view's own `receive` (the HTTP layer
adds nothing to verification; the verification matrix over HTTP is in
test_trainer_webhook_verification.py). Every forgery starts from a genuinely signed delivery and
breaks one thing an attacker or a careless network could: the secret, one bit of the body or
signature, the timestamp window, a header, the endpoint, or the body under a replayed id.
"""

from __future__ import annotations

import base64
import json
import random
import time
from collections import Counter

from controlplane.intake.models import ReceivedWebhook, WebhookEndpoint
from controlplane.intake.webhooks.trainer.receive import receive
from controlplane.notify.signing import sign
from controlplane.refresh.models import PolicyRefresh
from tests.integration.intake.conftest import OLD_SECRET, SECRET

FORGERIES = 10_000
SEED = 20261130


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


def test_ten_thousand_forged_webhooks_are_all_refused(source):
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

    accepted, statuses = [], Counter()
    t0 = time.perf_counter()
    for i in range(FORGERIES):
        kind = KINDS[i % len(KINDS)]
        endpoint, sent_headers, body = forge(kind, rng, genuine_id, genuine_body)
        answer = receive(endpoint, sent_headers, body)
        statuses[answer.status] += 1
        if answer.status < 400:
            accepted.append((kind, answer.status, answer.body))
    elapsed = time.perf_counter() - t0

    print(
        f"\nforged webhooks: {FORGERIES} sent, {len(accepted)} accepted; "
        f"statuses {dict(sorted(statuses.items()))}; {FORGERIES / elapsed:.0f}/s"
    )
    assert accepted == []
    # Only the genuine delivery was stored; nothing was planned.
    assert list(ReceivedWebhook.objects.values_list("webhook_id", flat=True)) == [genuine_id]
    assert not PolicyRefresh.objects.exists()
