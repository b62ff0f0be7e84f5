"""What every trainer event about one policy refresh checks first (`canary.verdict`,
`refresh.applied`): its data has the event's shape, the refresh is on the endpoint's source,
and its namespaces are within the endpoint's. Each refusal is the answer a handler returns."""

from __future__ import annotations

import json
from typing import Any

import pydantic

from controlplane.intake.webhooks.trainer.events import RefreshEvent
from controlplane.refresh.models import PolicyRefresh

#: A handler's answer: ((status, body), the delivery's detail or None for an error, refresh id).
Answer = tuple[tuple[int, dict[str, Any]], str | None, int | None]


def error(status: int, code: str, message: str, details: Any = None) -> tuple[int, dict]:
    return status, {"error": {"code": code, "message": message, "details": details}}


class Refused(Exception):
    """The event is refused before anything acts; `answer` is what the sender gets."""

    def __init__(self, status: int, code: str, message: str, details: Any = None) -> None:
        super().__init__(message)
        self.answer: Answer = (error(status, code, message, details), None, None)


def event_and_refresh[E: RefreshEvent](
    endpoint, model: type[E], data: Any, name: str
) -> tuple[E, PolicyRefresh]:
    """The validated event and its refresh; raises `Refused` (422, 404 or 403)."""
    try:
        event = model.model_validate(data)
    except pydantic.ValidationError as exc:
        details = json.loads(exc.json(include_url=False, include_input=False))
        raise Refused(422, "invalid_event", f"{name} data is invalid", details) from None
    refresh_id = event.refresh_id
    refresh = (
        PolicyRefresh.objects.select_related("source")
        .filter(pk=refresh_id, source=endpoint.source)
        .first()
    )
    if refresh is None:
        message = f"no policy refresh #{refresh_id} on this endpoint's source"
        raise Refused(404, "unknown_refresh", message)
    allowed = endpoint.namespaces
    if allowed and not set(refresh.namespaces or []) <= set(allowed):
        outside = sorted(set(refresh.namespaces or []) - set(allowed))
        raise Refused(403, "namespace_not_allowed", f"outside this endpoint: {outside}")
    return event, refresh
