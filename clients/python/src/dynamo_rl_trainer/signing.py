"""Standard Webhooks signatures (https://www.standardwebhooks.com), the sender's side.

The same scheme the control plane verifies (`controlplane/notify/signing.py`): the signed
content is `{webhook-id}.{webhook-timestamp}.{body}`, HMAC-SHA256 keyed with the bytes of a
`whsec_<base64>` secret, and `webhook-signature` carries one space-separated `v1,<base64>` entry
per secret. Signing with several secrets is how a rotation runs without a gap: sign with the old
and the new secret until the endpoint holds only the new one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
import uuid
from collections.abc import Sequence

SECRET_PREFIX = "whsec_"


def secret_bytes(secret: str) -> bytes:
    """The key inside a `whsec_` secret. Raises ValueError for anything the server would not
    accept either (not `whsec_`, not base64, not 24-64 bytes)."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError("webhook secrets start with whsec_")
    try:
        raw = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("webhook secret is not valid base64") from None
    if not 24 <= len(raw) <= 64:
        raise ValueError("webhook secret must decode to 24-64 bytes")
    return raw


def sign(secret: str, webhook_id: str, timestamp: int | str, body: bytes) -> str:
    """The `v1,<base64>` signature of one message with one secret."""
    content = f"{webhook_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_bytes(secret), content, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def new_webhook_id() -> str:
    """A fresh message id (`msg_<hex>`); the server keys replays on it."""
    return f"msg_{uuid.uuid4().hex}"


class Signer:
    """Signs outgoing webhooks with every configured secret (one during normal operation, two
    while a rotation is under way). Secrets are checked when the signer is built, so a typo
    fails at start-up rather than as a 401 on the first checkpoint."""

    def __init__(self, secrets: str | Sequence[str]) -> None:
        listed = [secrets] if isinstance(secrets, str) else list(secrets)
        if not listed:
            raise ValueError("give at least one webhook secret")
        for secret in listed:
            secret_bytes(secret)
        self.secrets: tuple[str, ...] = tuple(listed)

    def headers(
        self, body: bytes, *, webhook_id: str | None = None, timestamp: int | None = None
    ) -> dict[str, str]:
        """`webhook-id`, `webhook-timestamp` and `webhook-signature` for this body."""
        message_id = webhook_id or new_webhook_id()
        ts = int(time.time()) if timestamp is None else timestamp
        signatures = " ".join(sign(s, message_id, ts, body) for s in self.secrets)
        return {
            "webhook-id": message_id,
            "webhook-timestamp": str(ts),
            "webhook-signature": signatures,
        }

    def rotated(self, new_secret: str, *, keep_old: bool = True) -> Signer:
        """A signer for the next phase of a rotation: old and new secrets, or the new alone."""
        return Signer([*self.secrets, new_secret] if keep_old else [new_secret])
