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

from typing import Any

from controlplane.audit.recorder import Actor
from controlplane.intake.webhooks.trainer.events import Applied
from controlplane.intake.webhooks.trainer.refresh_event import (
    Answer,
    Refused,
    error,
    event_and_refresh,
)
from controlplane.refresh.errors import RefreshError
from controlplane.refresh.intents import external


def refresh_applied(endpoint, webhook_id: str, data: Any) -> Answer:
    """((status, body), detail, refresh id): detail None means the answer is an error."""
    try:
        event, refresh = event_and_refresh(endpoint, Applied, data, "refresh.applied")
    except Refused as refused:
        return refused.answer
    try:
        refresh = external.report_applied(
            refresh,
            actor=Actor.for_webhook(endpoint.name),
            weight_version=event.weight_version,
            instance_ids=event.instance_ids,
        )
    except RefreshError as exc:
        return error(409, exc.code, exc.message), None, None
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
