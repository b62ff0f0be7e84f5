"""`{% load drift_tags %}` — drift and quarantine on the fleet pages (fleet never imports refresh).

`{% drift_badge source %}`: how many workers of the source drift from their gates, and how many
are quarantined. `{% worker_drift worker %}`: the worker's drift entry and latest quarantine.
"""

from django import template

from controlplane.refresh.models import HELD_QUARANTINE_STATES, Gate, Quarantine

register = template.Library()


@register.inclusion_tag("refresh/drift_badge.html")
def drift_badge(source):
    entries = [
        entry
        for drift in Gate.objects.filter(source=source).values_list("drift", flat=True)
        for entry in drift
    ]
    held = Quarantine.objects.filter(source=source, state__in=HELD_QUARANTINE_STATES).count()
    return {"drift_count": len(entries), "quarantined": held, "entries": entries[:5]}


@register.inclusion_tag("refresh/worker_drift.html")
def worker_drift(worker):
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
    return {"entry": entry, "quarantine": quarantine}
