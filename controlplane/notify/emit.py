"""Emitting notifications: the `notify` service other apps call when something people should
know about happens (a refresh waits for approval, succeeds or is held; a gate opens, closes,
becomes unknown or is force-reopened; a source went stale).

`notify` is called inside the caller's transaction. It stores one delivery per interested
destination and enqueues the Celery delivery on commit, so a rolled-back change notifies nobody
and a slow destination never slows the change down. It never raises: a notification problem
must not undo a policy refresh.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.db import transaction
from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from controlplane import jobs
from controlplane.notify.delivery import DELIVER_TASK
from controlplane.notify.models import NotificationDelivery, NotificationDestination
from controlplane.notify.models import NotificationEvent as Event

logger = logging.getLogger(__name__)

EVENTS = frozenset(e.value for e in Event)

_TITLES = {
    Event.REFRESH_AWAITING_APPROVAL: "Policy refresh awaiting approval",
    Event.REFRESH_SUCCEEDED: "Policy refresh succeeded",
    Event.REFRESH_HELD: "Policy refresh held",
    Event.REFRESH_GROUP_READY: "Weight-update group ready: broadcast now",
    Event.REFRESH_READY_FOR_APPLY: "Workers paused: apply the weights now, then report applied",
    Event.REFRESH_CANARY_REVIEW: "Canary verified: verdict wanted",
    Event.REFRESH_WAITING: "Policy refresh waiting to be continued",
    Event.REFRESH_ANALYSIS_DONE: "Canary analysis done",
    Event.GATE_FORCE_REOPENED: "Gate force-reopened",
    Event.GATE_OPENED: "Gate opened",
    Event.GATE_CLOSED: "Gate closed",
    Event.GATE_UNKNOWN: "Gate unknown (source stale)",
    Event.SOURCE_STALE: "Source went stale",
    # drift
    Event.DRIFT_QUARANTINED: "Drifted worker quarantined",
    Event.DRIFT_ADMITTED: "Quarantined worker caught up and admitted",
    Event.DRIFT_FAILED: "Quarantined worker could not be caught up",
    Event.POLICY_LAG_EXCEEDED: "Serving policy too far behind the trainer",
    Event.TEST: "Test notification",
}


def absolute_url(path: str) -> str:
    return settings.PUBLIC_BASE_URL.rstrip("/") + path


def _refresh_link(refresh) -> str:
    try:
        path = reverse("refresh:detail", args=[refresh.pk])
    except NoReverseMatch:
        path = f"/refreshes/{refresh.pk}/"
    return absolute_url(path)


def _quarantine_data(q) -> dict[str, Any]:
    """Which worker, which drift, where its quarantine stands, and the API link to act on it."""
    try:
        path = reverse("intake:api-v1:get_quarantine", args=[q.pk])
    except NoReverseMatch:
        path = f"/api/v1/quarantines/{q.pk}"
    return {
        "id": q.pk,
        "namespace": q.namespace,
        "instance_id": q.instance_id,
        "key": q.key,
        "kind": q.kind,
        "detail": q.detail,
        "state": _jsonable(q.state),
        "attempts": q.attempts,
        "target_version": _jsonable((q.target or {}).get("weight_version")),
        "link": absolute_url(path),
    }


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float | bool | list | dict):
        return value
    return str(value)


def _iso(value) -> str | None:
    return value.isoformat() if value else None


def _gate_data(gate) -> dict[str, Any]:
    """What a receiver needs to know about one gate (the gate API has the rest)."""
    state = str(getattr(gate, "state", "") or "")
    forced = None
    if state == "open_forced":
        forced = {
            "by": str(getattr(gate, "forced_by", "") or ""),
            "at": _iso(getattr(gate, "forced_at", None)),
            "reason": str(getattr(gate, "reason", "") or ""),
        }
    return {
        "namespace": gate.namespace,
        "state": state,
        "open": bool(getattr(gate, "is_open", False)),
        "since": _iso(getattr(gate, "since", None)),
        "forced": forced,
        "verified_version": _jsonable(getattr(gate, "verified_version", None)),
        "verified_count": len(getattr(gate, "verified_instances", None) or ()),
        "unverified_count": _jsonable(getattr(gate, "unverified_count", None)),
        "revision": _jsonable(getattr(gate, "revision", None)),
    }


#: The signed trainer webhook event that answers a `refresh.canary_review`.
CANARY_VERDICT_EVENT = "canary.verdict"


def _canary_review(refresh) -> dict[str, Any]:
    """What a trainer needs to judge a canary and answer: the verified instances by namespace,
    the version they load, the deadline, and the two ways to send the verdict."""
    canary = dict((getattr(refresh, "progress", None) or {}).get("canary") or {})
    version = _jsonable((getattr(refresh, "target", None) or {}).get("weight_version"))
    try:
        path = reverse("intake:api-v1:record_canary_verdict", args=[refresh.pk])
    except NoReverseMatch:
        path = f"/api/v1/refreshes/{refresh.pk}/canary_verdict"
    return {
        "refresh_id": refresh.pk,
        "weight_version": version,
        "state": _jsonable(canary.get("state")),
        "evaluation": _jsonable(canary.get("evaluation")),
        "instances": _jsonable(canary.get("instances") or {}),
        "deadline": _jsonable(canary.get("deadline")),
        "answer": {
            "api": absolute_url(path),
            "webhook_event": CANARY_VERDICT_EVENT,
            # The answer's data: {refresh_id, weight_version, passed, metrics}.
            "fields": ["refresh_id", "weight_version", "passed", "metrics"],
        },
    }


#: The signed trainer webhook event that answers a `refresh.ready_for_apply`.
APPLIED_EVENT = "refresh.applied"


def ready_for_apply(refresh) -> dict[str, Any]:
    """What a trainer needs to apply the weights itself and answer: the version, the worker
    set (instance ids, namespaces, admin URLs), the deadline, and the two ways to report."""
    external = dict((getattr(refresh, "progress", None) or {}).get("external") or {})
    version = _jsonable((getattr(refresh, "target", None) or {}).get("weight_version"))
    try:
        path = reverse("intake:api-v1:report_applied", args=[refresh.pk])
    except NoReverseMatch:
        path = f"/api/v1/refreshes/{refresh.pk}/applied"
    return {
        "refresh_id": refresh.pk,
        "weight_version": version,
        "attempt": _jsonable(external.get("attempt")),
        "state": _jsonable(external.get("state")),
        "deadline": _jsonable(external.get("deadline")),
        "workers": _jsonable(list(external.get("workers") or [])),
        "applied": sorted(
            str(a.get("instance_id") or key) for key, a in (external.get("applied") or {}).items()
        ),
        "answer": {
            "api": absolute_url(path),
            "webhook_event": APPLIED_EVENT,
            # The answer's data: {refresh_id, weight_version, instance_ids (omitted: all)}.
            "fields": ["refresh_id", "weight_version", "instance_ids"],
        },
    }


def build_payload(
    event: str, *, source=None, refresh=None, gate=None, gates=(), reason: str = "", quarantine=None
) -> dict[str, Any]:
    """The JSON body generic webhooks receive (Standard Webhooks shape: type, timestamp, data)."""
    data: dict[str, Any] = {"reason": reason}
    if refresh is not None:
        source = source or getattr(refresh, "source", None)
        data["refresh"] = {
            "id": refresh.pk,
            "state": _jsonable(getattr(refresh, "state", None)),
            "target": _jsonable(getattr(refresh, "target", None)),
            "link": _refresh_link(refresh),
        }
        if event == Event.REFRESH_GROUP_READY:
            # What the trainer needs to broadcast: the group's world size and rank map.
            data["refresh"]["group"] = _jsonable(getattr(refresh, "group", None))
        if event == Event.REFRESH_READY_FOR_APPLY:
            # What the trainer applies to: the paused workers and until when it may report.
            data["refresh"]["external"] = ready_for_apply(refresh)
        if event == Event.REFRESH_CANARY_REVIEW:
            # What the trainer evaluates: the canary's verified instances, by namespace, and
            # until when a verdict is taken.
            data["refresh"]["canary"] = _canary_review(refresh)
        if not reason:
            data["reason"] = str(getattr(refresh, "held_reason", "") or "")
    if gate is not None:
        source = source or getattr(gate, "source", None)
        data["gate"] = _gate_data(gate)
    if gates:
        source = source or getattr(gates[0], "source", None)
        data["gates"] = [_gate_data(g) for g in gates]
    if quarantine is not None:
        source = source or getattr(quarantine, "source", None)
        data["quarantine"] = _quarantine_data(quarantine)
        if not reason:
            data["reason"] = str(quarantine.reason or "")
    if source is not None:
        data["source"] = {"id": source.pk, "name": source.name}
        if event == Event.SOURCE_STALE and not reason:
            data["reason"] = str(getattr(source, "stale_reason", "") or "")
    return {
        "type": event,
        "title": _TITLES.get(Event(event), event),
        "timestamp": timezone.now().isoformat(),
        "data": data,
    }


def notify(
    event: str,
    *,
    source=None,
    refresh=None,
    gate=None,
    gates=(),
    reason: str = "",
    quarantine=None,
) -> None:
    """Queue `event` to every enabled destination that subscribes to it (and to its source).

    `gate` describes one gate (`data.gate`); `gates` several of one source (`data.gates`);
    `quarantine` one quarantined worker (`data.quarantine`)."""
    if event not in EVENTS:
        logger.error("unknown notification event %r ignored", event)
        return
    try:
        payload = build_payload(
            event,
            source=source,
            refresh=refresh,
            gate=gate,
            gates=gates,
            reason=reason,
            quarantine=quarantine,
        )
        source_id = (payload["data"].get("source") or {}).get("id")
        with transaction.atomic():
            deliveries = [
                NotificationDelivery.objects.create(
                    destination=destination, event=event, payload=payload
                )
                for destination in NotificationDestination.objects.filter(enabled=True)
                if destination.wants(event, source_id)
            ]
    except Exception:
        logger.exception("notification %s could not be queued", event)
        return
    for delivery in deliveries:
        enqueue_delivery(delivery.pk)


def enqueue_delivery(delivery_id: int) -> None:
    # The delivery row stays pending and visible in the log when the send is refused (the
    # broker being down must not turn a committed policy refresh into an error); the sweeper
    # sends it again (notify.sweep_stuck_deliveries).
    jobs.enqueue(DELIVER_TASK, delivery_id)
