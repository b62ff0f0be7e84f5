"""`{% load drill_tags %}` — rollback drills on the fleet pages (fleet never imports refresh).

`{% drill_status source %}`: when the source's rollback was last proven and how long each
direction took, or that it never was, or why the last drill failed (fleet overview).
`{% drill_history source %}`: the last ten drills and the "Run rollback drill" button
(source page).
"""

from django import template

from controlplane.accounts.roles import Perm
from controlplane.refresh.models import DrillOutcome, DrillRun

register = template.Library()

HISTORY = 10


@register.inclusion_tag("refresh/drill_status.html")
def drill_status(source):
    drills = DrillRun.objects.filter(source=source).order_by("-started_at", "-id")
    return {
        "source": source,
        "proven": drills.filter(outcome=DrillOutcome.SUCCEEDED).first(),
        "latest": drills.exclude(outcome=DrillOutcome.RUNNING).first(),
        "running": drills.filter(outcome=DrillOutcome.RUNNING).first(),
    }


@register.inclusion_tag("refresh/drill_history.html", takes_context=True)
def drill_history(context, source):
    user = getattr(context.get("request"), "user", None)
    return {
        "source": source,
        "drills": list(
            DrillRun.objects.filter(source=source)
            .select_related("forward_refresh", "back_refresh")
            .order_by("-started_at", "-id")[:HISTORY]
        ),
        "can_drill": bool(user and user.has_perm(Perm.OPERATE_REFRESH)),
        "csrf_token": context.get("csrf_token"),
    }
