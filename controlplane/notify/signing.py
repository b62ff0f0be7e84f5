"""Standard Webhooks signatures (https://www.standardwebhooks.com), both directions.

The signed content is `{webhook-id}.{webhook-timestamp}.{body}`; the signature header carries
one or more space-separated `v1,<base64 HMAC-SHA256>` entries so a sender can sign with an old
and a new secret while a rotation is under way. Secrets are `whsec_<base64 of 24-64 bytes>`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass

SECRET_PREFIX = "whsec_"
_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,200}$")
_TIMESTAMP = re.compile(r"^[0-9]{1,12}$")
# A base64 HMAC-SHA256 is 44 characters; allow some slack but refuse absurd headers early.
MAX_SIGNATURE_HEADER = 4096


class VerificationError(Exception):
    """Why a webhook was refused. `code` is stable and goes into the error body and audit row."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def generate_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def secret_bytes(secret: str) -> bytes:
    """Decode a `whsec_` secret. Raises ValueError for anything else."""
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
    """The `v1,<base64>` signature of one message."""
    content = f"{webhook_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_bytes(secret), content, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def sign_headers(
    secrets_: list[str] | str, webhook_id: str, body: bytes, *, timestamp: int | None = None
) -> dict[str, str]:
    """Headers for an outgoing message, signed with every given secret."""
    if isinstance(secrets_, str):
        secrets_ = [secrets_]
    ts = int(time.time()) if timestamp is None else timestamp
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(ts),
        "webhook-signature": " ".join(sign(s, webhook_id, ts, body) for s in secrets_),
    }


@dataclass(frozen=True)
class Verified:
    webhook_id: str
    timestamp: int


def verify(
    secrets_: list[str],
    headers: dict[str, str],
    body: bytes,
    *,
    tolerance_seconds: int,
    now: float | None = None,
) -> Verified:
    """Check id, timestamp window and signature; raise VerificationError with the reason.

    `headers` must have lower-case keys. Every configured secret is tried against every offered
    signature with `hmac.compare_digest`, so neither the matching secret nor the position of a
    valid signature shows in the timing.
    """
    webhook_id = headers.get("webhook-id")
    raw_ts = headers.get("webhook-timestamp")
    raw_sig = headers.get("webhook-signature")
    if not webhook_id or not raw_ts or not raw_sig:
        missing = [
            name
            for name, value in (
                ("webhook-id", webhook_id),
                ("webhook-timestamp", raw_ts),
                ("webhook-signature", raw_sig),
            )
            if not value
        ]
        raise VerificationError("missing_headers", "missing header(s): " + ", ".join(missing))
    if not _ID.match(webhook_id):
        raise VerificationError("malformed_id", "webhook-id must be 1-200 of [A-Za-z0-9._:-]")
    if not _TIMESTAMP.match(raw_ts):
        raise VerificationError("malformed_timestamp", "webhook-timestamp must be Unix seconds")
    timestamp = int(raw_ts)
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_seconds:
        raise VerificationError(
            "timestamp_out_of_window",
            f"webhook-timestamp is more than {tolerance_seconds} s from the server's clock",
        )
    if len(raw_sig) > MAX_SIGNATURE_HEADER:
        raise VerificationError("malformed_signature", "webhook-signature header is too long")
    offered: list[bytes] = []
    for entry in raw_sig.split():
        version, _, value = entry.partition(",")
        if version != "v1" or not value:
            continue  # other schemes (e.g. v1a asymmetric) are not ours to judge
        try:
            offered.append(base64.b64decode(value, validate=True))
        except (binascii.Error, ValueError):
            continue
    if not offered:
        raise VerificationError(
            "malformed_signature", "webhook-signature has no well-formed v1 signature"
        )
    content = f"{webhook_id}.{raw_ts}.".encode() + body
    matched = False
    for secret in secrets_:
        try:
            key = secret_bytes(secret)
        except ValueError:
            continue
        expected = hmac.new(key, content, hashlib.sha256).digest()
        for candidate in offered:
            matched |= hmac.compare_digest(expected, candidate)
    if not matched:
        raise VerificationError("bad_signature", "no signature matches this endpoint's secrets")
    return Verified(webhook_id=webhook_id, timestamp=timestamp)
