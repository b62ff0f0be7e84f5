"""`POST /api/v1/webhooks/trainer/<endpoint>`: the HTTP face of `receive.receive`."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest
from ninja import Router, Schema, Status
from pydantic import Field

from controlplane.audit.recorder import client_ip
from controlplane.intake.api.errors import ErrorOut
from controlplane.intake.webhooks.trainer.events import (
    EVENT_TYPES,
    Applied,
    BroadcastDone,
    CanaryVerdict,
    CheckpointReady,
)
from controlplane.intake.webhooks.trainer.published import PolicyPublished
from controlplane.intake.webhooks.trainer.receive import receive, too_large

router = Router(tags=["trainer webhooks"])


class WebhookResult(Schema):
    status: str = Field(description="accepted, pending, already_processed, or ok (test.ping)")
    webhook_id: str
    delivery_id: int | None = None
    state: str | None = Field(None, description="queued, processing, retrying, retryable or done")
    outcome: str = Field(description="accepted until the delivery is done, then its outcome")
    refresh_id: int | None = None
    attempts: int | None = None
    last_error: str | None = None
    detail: str | None = None
    queued: bool | None = Field(
        None,
        description="checkpoint.ready: whether the delivery's task reached the task queue. "
        "false: the delivery is stored all the same and `recovery` says when it runs",
    )
    recovery: str | None = Field(
        None, description="when `queued` is false: what enqueues the delivery, and within when"
    )
    group: dict[str, Any] | None = Field(
        None, description="broadcast.done: the refresh's group and handshake state"
    )
    canary: dict[str, Any] | None = Field(
        None, description="canary.verdict: the canary's state, verdict and instances"
    )
    external: dict[str, Any] | None = Field(
        None,
        description="refresh.applied: the external update's wait (workers, applied, missing)",
    )
    created: bool | None = Field(
        None,
        description="policy.published: false when the same publication was recorded before "
        "(same lineage, step, version and digest)",
    )
    published: dict[str, Any] | None = Field(
        None,
        description="policy.published: the recorded publication (lineage, step, "
        "weight_version, checkpoint_digest, published_at)",
    )


def _inline(schema: dict[str, Any]) -> dict[str, Any]:
    """Resolve pydantic's local `$defs` references, so the schema can sit inside an operation."""
    defs = schema.pop("$defs", {})

    def walk(node):
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return walk(dict(defs[ref.rsplit("/", 1)[1]]))
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(schema)


_HEADERS = [
    {
        "in": "header",
        "name": name,
        "required": True,
        "schema": {"type": "string"},
        "description": text,
    }
    for name, text in (
        ("webhook-id", "unique message id; a repeat is answered as already processed"),
        ("webhook-timestamp", "Unix seconds; must be within 5 minutes of the server clock"),
        ("webhook-signature", "space-separated `v1,<base64 HMAC-SHA256>` signatures"),
    )
]
_BODY = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["type", "data"],
                "properties": {
                    "type": {
                        "type": "string",
                        "enum": list(EVENT_TYPES),
                    },
                    "timestamp": {"type": "string"},
                    "data": {
                        "anyOf": [
                            _inline(CheckpointReady.model_json_schema()),
                            _inline(BroadcastDone.model_json_schema()),
                            _inline(CanaryVerdict.model_json_schema()),
                            _inline(PolicyPublished.model_json_schema()),
                            _inline(Applied.model_json_schema()),
                        ]
                    },
                },
            }
        }
    },
}


@router.post(
    "/webhooks/trainer/{endpoint}",
    auth=None,
    response={
        200: WebhookResult,
        202: WebhookResult,
        400: ErrorOut,
        401: ErrorOut,
        403: ErrorOut,
        404: ErrorOut,
        409: ErrorOut,
        413: ErrorOut,
        422: ErrorOut,
    },
    openapi_extra={"parameters": _HEADERS, "requestBody": _BODY},
)
def trainer_webhook(request: HttpRequest, endpoint: str) -> Status:
    """A trainer's "checkpoint ready" event, signed with the Standard Webhooks scheme (or its
    `broadcast.done` for a distributed refresh, or its `canary.verdict` on a canary waiting in
    `canary_review`: both acted on at once and answered 200, 409 when nothing waits for them;
    or its `policy.published`: a checkpoint it published, step, version and digest, recorded
    for policy lag and answered 200, 409 `not_monotonic` when it would move its lineage
    backwards; or its `refresh.applied` for an external refresh waiting in `awaiting_apply`:
    acted on at once, 409 with the refusal's code for another version, an instance the
    refresh did not announce, or a refresh waiting for no report).

    Stored and answered 202 at once; the refresh is planned in the background. Read the outcome
    at `GET /api/v1/webhooks/deliveries/{webhook_id}` or by sending the same delivery again."""
    declared = request.META.get("CONTENT_LENGTH") or "0"
    if declared.isdigit() and int(declared) > settings.WEBHOOK_MAX_BODY_BYTES:
        answer = too_large(endpoint, source_ip=client_ip(request))
        return Status(answer.status, answer.body)
    try:
        body = request.body
    except RequestDataTooBig:
        answer = too_large(endpoint, source_ip=client_ip(request))
        return Status(answer.status, answer.body)
    headers = {name.lower(): value for name, value in request.headers.items()}
    answer = receive(endpoint, headers, body, source_ip=client_ip(request))
    return Status(answer.status, answer.body)
