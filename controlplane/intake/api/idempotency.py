"""`Idempotency-Key` for POST endpoints that start work.

Same key and same request → the stored original response (with `Idempotent-Replayed: true`);
same key, different request → 422; same key while the first is still running → 409. Keys are
scoped to the caller (token or user) and stored with a unique constraint, which is what decides
a race between two first uses.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from ninja import Status

from controlplane.intake.api.errors import ApiError
from controlplane.intake.models import IdempotencyRecord, IdempotencyState
from controlplane.textlimits import REQUEST_PATH_CHARS

HEADER = "Idempotency-Key"
_KEY = re.compile(r"^[\x21-\x7e]{1,200}$")
#: A first use that has not finished after this long is presumed dead (its process crashed),
#: and the key may be used again.
IN_FLIGHT_TIMEOUT = timedelta(minutes=10)

OPENAPI_PARAMETER = {
    "parameters": [
        {
            "in": "header",
            "name": HEADER,
            "required": False,
            "schema": {"type": "string", "maxLength": 200},
            "description": "Retry-safe key: the same key and body return the first response.",
        }
    ]
}


def _principal(request: HttpRequest) -> str:
    token = getattr(request, "api_token", None)
    if token is not None:
        return f"token:{token.pk}"
    return f"user:{request.user.pk}"


def _fingerprint(request: HttpRequest) -> str:
    digest = hashlib.sha256()
    digest.update((request.method or "").encode() + b" " + request.path.encode() + b"\n")
    digest.update(request.body)
    return digest.hexdigest()


def run(
    request: HttpRequest, response: HttpResponse, action: Callable[[], tuple[int, Any]]
) -> Status:
    """Run `action` (returning status and a JSON-safe body) at most once per key."""
    key = request.headers.get(HEADER)
    if key is None:
        return Status(*action())
    if not _KEY.match(key):
        raise ApiError(400, "bad_idempotency_key", f"{HEADER} must be 1-200 printable characters")
    principal, fingerprint = _principal(request), _fingerprint(request)
    record = _claim(request, principal, key, fingerprint)
    if record.state == IdempotencyState.DONE:
        response["Idempotent-Replayed"] = "true"
        assert record.status_code is not None  # a DONE record stored its answer
        return Status(record.status_code, record.response_body)
    try:
        status, body = action()
    except BaseException:
        # A failed first use leaves no trace, so the caller may retry with the same key.
        IdempotencyRecord.objects.filter(pk=record.pk).delete()
        raise
    IdempotencyRecord.objects.filter(pk=record.pk).update(
        state=IdempotencyState.DONE,
        status_code=status,
        response_body=body,
        completed_at=timezone.now(),
    )
    return Status(status, body)


def _claim(request, principal: str, key: str, fingerprint: str) -> IdempotencyRecord:
    """Insert the in-flight row, or return the finished one for a repeat (raising 409/422)."""
    try:
        with transaction.atomic():
            return IdempotencyRecord.objects.create(
                principal=principal,
                key=key,
                operation=request.path[:REQUEST_PATH_CHARS],
                request_hash=fingerprint,
                user=request.user if request.user.is_authenticated else None,
            )
    except IntegrityError:
        pass
    existing = IdempotencyRecord.objects.filter(principal=principal, key=key).first()
    if existing is None:  # the first use failed and was deleted meanwhile: try once more
        return _claim(request, principal, key, fingerprint)
    if existing.request_hash != fingerprint:
        raise ApiError(
            422,
            "idempotency_key_reused",
            f"this {HEADER} was used for a different request",
        )
    if existing.state == IdempotencyState.IN_FLIGHT:
        stale_before = timezone.now() - IN_FLIGHT_TIMEOUT
        taken = IdempotencyRecord.objects.filter(
            pk=existing.pk, state=IdempotencyState.IN_FLIGHT, created_at__lt=stale_before
        ).update(created_at=timezone.now())
        if taken:
            existing.refresh_from_db()
            return existing
        raise ApiError(
            409, "idempotency_key_in_flight", f"a request with this {HEADER} is still running"
        )
    return existing
