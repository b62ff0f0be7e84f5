"""`canary.verdict`: the trainer's pass/fail on a canary's verified instances.

The signed-webhook form of `POST /api/v1/refreshes/<id>/canary_verdict`, answering a
`refresh.canary_review` notification. Acted on at once — the canary waits, its workers serving
the new policy outside the gate — and idempotent: a repeat of the same webhook id is answered
from the stored delivery, and the same verdict again changes nothing. Refused (409) when no
canary waits or the version is not the refresh's; a trainer may only judge refreshes of its
endpoint's source and namespaces. Only a canary with `evaluation: trainer` takes the trainer's
verdict: on a `manual` one (a person approves it) the delivery is stored with its refusal as
the detail, answered 409 `canary_not_trainer_judged`, audited, and nothing moves.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError

from controlplane.audit.recorder import Actor
from controlplane.intake.webhooks.trainer.events import CanaryVerdict
from controlplane.intake.webhooks.trainer.refresh_event import (
    Answer,
    Refused,
    error,
    event_and_refresh,
)
from controlplane.refresh.errors import RefreshError
from controlplane.refresh.intents import canary
from controlplane.refresh.models import PolicyRefresh
from controlplane.refresh.progress import CanaryReview, canary_of


def canary_verdict(endpoint, webhook_id: str, data: Any) -> Answer:
    """((status, body), detail, refresh id): detail None means the answer is an error."""
    try:
        event, refresh = event_and_refresh(endpoint, CanaryVerdict, data, "canary.verdict")
    except Refused as refused:
        return refused.answer
    try:
        refresh = canary.record_canary_verdict(
            refresh,
            passed=event.passed,
            metrics=event.metrics,
            reason=event.reason,
            weight_version=event.weight_version,
            actor=Actor.for_webhook(endpoint.name),
        )
    except canary.TrainerVerdictRefused as exc:
        # Not a sender's mistake to reject unrecorded but a verdict this canary never takes
        # (a person judges it): stored as done with the refusal, so a repeat of the webhook id
        # is answered from the delivery and the trainer can read why. Nothing moved.
        return error(409, exc.code, exc.message), f"refused: {exc.message}", refresh.pk
    except RefreshError as exc:
        return error(409, exc.code, exc.message), None, None
    except ValidationError as exc:
        return error(422, "invalid_event", "; ".join(exc.messages)), None, None
    verdict = "passed" if event.passed else "failed"
    detail = f"canary of policy refresh #{refresh.pk} {verdict}"
    body = {
        "status": "ok",
        "webhook_id": webhook_id,
        "outcome": "canary_verdict",
        "refresh_id": refresh.pk,
        "detail": detail,
        "canary": public_canary(refresh),
    }
    return (200, body), detail, refresh.pk


def public_canary(refresh: PolicyRefresh) -> dict[str, Any]:
    """The canary as a trainer may read it back: state, verdict, instances, deadline."""
    review = canary_of(refresh) or CanaryReview()
    keys = ("state", "evaluation", "verdict", "instances", "deadline", "by", "at", "metrics")
    return {
        "refresh_state": refresh.state,
        "weight_version": refresh.weight_version,
        **{key: review.get(key) for key in keys},
    }
