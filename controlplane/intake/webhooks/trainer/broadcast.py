"""`broadcast.done`: the trainer says it broadcast a distributed refresh's weights.

The signed-webhook form of `POST /api/v1/refreshes/<id>/broadcast_done`. Acted on at once —
the refresh is waiting, with its workers paused in a formed group — and idempotent: a repeat
of the same webhook id is answered from the stored delivery before anything acts (so a
replayed report never meets a group formed again since), and a second report changes nothing.
The report names the handshake `attempt` it is about (`refresh.group_ready` carries it); one
for an earlier attempt is refused (409). A trainer may only report for refreshes of its
endpoint's source.
"""

from __future__ import annotations

import json
from typing import Any

import pydantic

from controlplane.audit.recorder import Actor
from controlplane.intake.models import ReceivedWebhook
from controlplane.intake.webhooks.trainer.events import BroadcastDone
from controlplane.refresh import handshake
from controlplane.refresh.errors import RefreshError
from controlplane.refresh.models import PolicyRefresh


def _error(status: int, code: str, message: str, details: Any = None):
    return status, {"error": {"code": code, "message": message, "details": details}}


def broadcast_done(
    endpoint, webhook_id: str, data: Any
) -> tuple[tuple[int, dict[str, Any]], str | None]:
    """((status, body), detail): detail None means the answer is an error to reject with.

    A webhook id stored before acts on nothing: the detail given back makes the receiver store
    it, which finds the stored delivery and answers as a repeat (or 409 for another body)."""
    if ReceivedWebhook.objects.filter(endpoint=endpoint, webhook_id=webhook_id).exists():
        return (200, {}), "a repeat of a stored delivery"
    try:
        event = BroadcastDone.model_validate(data)
    except pydantic.ValidationError as exc:
        details = json.loads(exc.json(include_url=False, include_input=False))
        return _error(422, "invalid_event", "broadcast.done data is invalid", details), None
    refresh = (
        PolicyRefresh.objects.select_related("source")
        .filter(pk=event.refresh_id, source=endpoint.source)
        .first()
    )
    if refresh is None:
        message = f"no policy refresh #{event.refresh_id} on this endpoint's source"
        return _error(404, "unknown_refresh", message), None
    allowed = endpoint.namespaces
    if allowed and not set(refresh.namespaces or []) <= set(allowed):
        outside = sorted(set(refresh.namespaces or []) - set(allowed))
        return _error(403, "namespace_not_allowed", f"outside this endpoint: {outside}"), None
    try:
        refresh = handshake.report_broadcast_done(
            refresh,
            actor=Actor.for_webhook(endpoint.name),
            weight_version=event.weight_version,
            attempt=event.attempt,
        )
    except RefreshError as exc:
        return _error(409, exc.code, exc.message), None
    detail = f"broadcast recorded on policy refresh #{refresh.pk}"
    body = {
        "status": "ok",
        "webhook_id": webhook_id,
        "outcome": "broadcast_done",
        "refresh_id": refresh.pk,
        "group": handshake.public_view(refresh),
    }
    return (200, body), detail
