"""`policy.published`: the trainer announces a checkpoint it published, refresh or not.

The light sibling of `checkpoint.ready`: a step, a weight version and a digest, recorded as a
fact (`fleet.PublishedPolicy`, refresh/policy_lag.py) so the control plane can say how far
behind the trainer each namespace serves. Acted on at once and idempotent: a repeat of the
same webhook id is answered from the stored delivery, the same (lineage, step, version,
digest) from another delivery is the same fact again (200, `created: false`), and a step older
than the lineage's latest, or a version already published at another step, is refused (409
`not_monotonic`). A `checkpoint.ready` with a `step` is recorded the same way (receive.py).

Once recorded, the source's max-lag policy is evaluated (`refresh.enforce_policy_lag`).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from controlplane import jobs
from controlplane.dynamo import limits
from controlplane.intake.models import ReceivedWebhook
from controlplane.refresh.apps import ENFORCE_LAG_TASK
from controlplane.refresh.policy_lag import NotMonotonic, publish

POLICY_PUBLISHED = "policy.published"


class PolicyPublished(BaseModel):
    """A published policy checkpoint: which training step, which version, which bytes."""

    model_config = ConfigDict(extra="forbid")

    step: int = Field(ge=0, le=2**63 - 1, description="training step of the checkpoint")
    weight_version: str | int = Field(description="the version workers report once they serve it")
    checkpoint_digest: str = Field(
        min_length=1, max_length=200, description="digest of the checkpoint's bytes"
    )
    lineage: str = Field(
        "",
        max_length=limits.NAME_MAX,
        pattern=r"^[-a-zA-Z0-9_.]*$",
        description="the training run; versions and steps only move forward within one",
    )
    namespaces: list[str] | None = Field(
        None, description="a subset of the endpoint's namespaces; default all of them"
    )
    published_at: datetime | None = Field(
        None, description="when the trainer published it (ISO 8601); default: on receipt"
    )


def _error(status: int, code: str, message: str, details: Any = None):
    return status, {"error": {"code": code, "message": message, "details": details}}


def policy_published(
    endpoint, webhook_id: str, data: Any
) -> tuple[tuple[int, dict[str, Any]], str | None]:
    """((status, body), detail): detail None means the answer is an error to reject with."""
    if ReceivedWebhook.objects.filter(endpoint=endpoint, webhook_id=webhook_id).exists():
        return (200, {}), "a repeat of a stored delivery"
    try:
        event = PolicyPublished.model_validate(data)
    except pydantic.ValidationError as exc:
        details = json.loads(exc.json(include_url=False, include_input=False))
        return _error(422, "invalid_event", "policy.published data is invalid", details), None
    if isinstance(event.weight_version, str) and not event.weight_version.strip():
        return _error(422, "invalid_event", "weight_version must not be empty"), None
    allowed = endpoint.namespaces
    if event.namespaces and allowed and not set(event.namespaces) <= set(allowed):
        outside = sorted(set(event.namespaces) - set(allowed))
        return _error(403, "namespace_not_allowed", f"outside this endpoint: {outside}"), None
    namespaces = event.namespaces or list(allowed or [])
    try:
        done = publish(
            endpoint.source,
            step=event.step,
            version=event.weight_version,
            digest=event.checkpoint_digest,
            lineage=event.lineage,
            namespaces=namespaces,
            published_at=event.published_at,
            webhook_id=webhook_id,
            event_type=POLICY_PUBLISHED,
        )
    except NotMonotonic as exc:
        return _error(409, "not_monotonic", str(exc)), None
    jobs.enqueue(ENFORCE_LAG_TASK, endpoint.source_id)
    row = done.policy
    body = {
        "status": "ok",
        "webhook_id": webhook_id,
        "outcome": "policy_published",
        "created": done.created,
        "published": {
            "lineage": row.lineage,
            "step": row.step,
            "weight_version": row.version,
            "checkpoint_digest": row.digest,
            "published_at": row.published_at.isoformat(),
        },
    }
    verb = "published" if done.created else "already published"
    return (200, body), f"step {row.step} ({row.version_key}) {verb}"


def record_checkpoint(endpoint, webhook_id: str, event) -> dict[str, Any]:
    """A `checkpoint.ready` with a step counts as a publication too; what happened, for its
    audit row (a refused one does not stop the refresh it asks for)."""
    if event.step is None:
        return {"published": False, "why": "no step"}
    try:
        done = publish(
            endpoint.source,
            step=event.step,
            version=event.weight_version,
            digest=event.checkpoint_digest or "",
            namespaces=event.namespaces or list(endpoint.namespaces or []),
            webhook_id=webhook_id,
            event_type="checkpoint.ready",
        )
    except NotMonotonic as exc:
        return {"published": False, "why": str(exc)}
    jobs.enqueue(ENFORCE_LAG_TASK, endpoint.source_id)
    return {"published": True, "created": done.created}
