"""`refresh.applied`: the trainer's framework applied an external refresh's weights itself.

The signed-webhook form of `POST /api/v1/refreshes/<id>/applied`, answering a
`refresh.ready_for_apply` notification. Acted on at once — the refresh waits, its workers
paused — and idempotent: a repeat of the same webhook id is answered from the stored delivery
before anything acts, and a report already recorded changes nothing. Refused (409 with the
refusal's code, nothing changes) for another version (`weight_version_mismatch`), for an
instance the refresh did not announce (`instance_not_in_refresh`), or when it waits for no
report (`not_awaiting_apply`); 404 `unknown_refresh` for a refresh that is not this endpoint's
source's. A trainer may only report for its endpoint's namespaces.
"""

from __future__ import annotations

import json
from typing import Any

import pydantic

from controlplane.audit.recorder import Actor
from controlplane.intake.webhooks.trainer.events import Applied
from controlplane.refresh.errors import RefreshError
from controlplane.refresh.intents import external
from controlplane.refresh.models import PolicyRefresh


def _error(status: int, code: str, message: str, details: Any = None):
    return status, {"error": {"code": code, "message": message, "details": details}}


def refresh_applied(
    endpoint, webhook_id: str, data: Any
) -> tuple[tuple[int, dict[str, Any]], str | None, int | None]:
    """((status, body), detail, refresh id): detail None means the answer is an error."""
    try:
        event = Applied.model_validate(data)
    except pydantic.ValidationError as exc:
        details = json.loads(exc.json(include_url=False, include_input=False))
        return _error(422, "invalid_event", "refresh.applied data is invalid", details), None, None
    refresh = (
        PolicyRefresh.objects.select_related("source")
        .filter(pk=event.refresh_id, source=endpoint.source)
        .first()
    )
    if refresh is None:
        message = f"no policy refresh #{event.refresh_id} on this endpoint's source"
        return _error(404, "unknown_refresh", message), None, None
    allowed = endpoint.namespaces
    if allowed and not set(refresh.namespaces or []) <= set(allowed):
        outside = sorted(set(refresh.namespaces or []) - set(allowed))
        answer = _error(403, "namespace_not_allowed", f"outside this endpoint: {outside}")
        return answer, None, None
    try:
        refresh = external.report_applied(
            refresh,
            actor=Actor.for_webhook(endpoint.name),
            weight_version=event.weight_version,
            instance_ids=event.instance_ids,
        )
    except RefreshError as exc:
        return _error(409, exc.code, exc.message), None, None
    view = external.public_view(refresh)
    detail = (
        f"applied recorded on policy refresh #{refresh.pk} "
        f"({len(view['applied'])} of {len(view['workers'])} workers)"
    )
    body = {
        "status": "ok",
        "webhook_id": webhook_id,
        "outcome": "applied",
        "refresh_id": refresh.pk,
        "detail": detail,
        "external": view,
    }
    return (200, body), detail, refresh.pk
