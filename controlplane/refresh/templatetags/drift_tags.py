"""`{% load drift_tags %}` — drift and quarantine on the fleet pages (fleet never imports refresh).

`{% drift_badge source %}`: how many workers of the source drift from their gates, and how many
are quarantined. `{% worker_drift worker %}`: the worker's drift entry and latest quarantine, with
the quarantine's exits (retry, release, drop) for people who may operate refreshes.
"""

from collections.abc import Iterable

from django import template
from django.db.models import Count

from controlplane.accounts.roles import Perm
from controlplane.fleet.models import WorkerState
from controlplane.refresh import source_badges
from controlplane.refresh.models import (
    HELD_QUARANTINE_STATES,
    Gate,
    Quarantine,
    QuarantineState,
)
from controlplane.refresh.quarantine import stalled

register = template.Library()


#: The render-context key of the drift badges read once per page render.
_DRIFT = object()


def drift_by_source(source_ids: Iterable[int]) -> dict[int, dict]:
    """Per source id, its drift entries and held quarantines: two queries however many."""
    ids = set(source_ids)
    entries: dict[int, list] = {pk: [] for pk in ids}
    for source_id, drift in Gate.objects.filter(source_id__in=ids).values_list(
        "source_id", "drift"
    ):
        entries[source_id] += drift or []
    held = dict(
        Quarantine.objects.filter(source_id__in=ids, state__in=HELD_QUARANTINE_STATES)
        .values_list("source_id")
        .annotate(n=Count("id"))
        .order_by()
    )
    return {
        pk: {
            "drift_count": len(entries[pk]),
            "quarantined": held.get(pk, 0),
            "entries": entries[pk][:5],
        }
        for pk in ids
    }


@register.inclusion_tag("refresh/drift_badge.html", takes_context=True)
def drift_badge(context, source):
    """Read for every source the page lists at once (`refresh.source_badges`)."""
    return source_badges.for_source(context, _DRIFT, source, drift_by_source)


@register.inclusion_tag("refresh/worker_drift.html", takes_context=True)
def worker_drift(context, worker):
    entry = next(
        (
            d
            for drift in Gate.objects.filter(
                source_id=worker.source_id, namespace=worker.namespace
            ).values_list("drift", flat=True)
            for d in drift
            if d.get("instance_id") == worker.instance_id
        ),
        None,
    )
    quarantine = (
        Quarantine.objects.filter(
            source_id=worker.source_id, namespace=worker.namespace, instance_id=worker.instance_id
        )
        .order_by("-id")
        .first()
    )
    return {"entry": entry, "quarantine": quarantine, **_exits(context, worker, quarantine)}


def _exits(context, worker, quarantine) -> dict:
    """Which exit buttons make sense now (each action still checks state and permission)."""
    user = getattr(context.get("request"), "user", None)
    if quarantine is None or not quarantine.is_open or user is None:
        return {}
    if not user.has_perm(Perm.OPERATE_REFRESH):
        return {}
    held = quarantine.state in (QuarantineState.QUARANTINED, QuarantineState.FAILED)
    is_stalled = Quarantine.objects.filter(stalled(), pk=quarantine.pk).exists()
    return {
        "can_retry": held or is_stalled,
        "can_release": held,
        # Drop is for a worker that left the fleet; while it is there retry or release it.
        "can_drop": worker.state == WorkerState.GONE,
    }
