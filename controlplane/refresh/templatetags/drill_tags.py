"""`{% load drill_tags %}` — rollback drills on the fleet pages (fleet never imports refresh).

`{% drill_status source %}`: when the source's rollback was last proven and how long each
direction took, or that it never was, or why the last drill failed (fleet overview).
`{% drill_history source %}`: the last ten drills and the "Run rollback drill" button
(source page).
"""

from django import template

from controlplane.accounts.roles import Perm
from controlplane.refresh import source_badges
from controlplane.refresh.drill_history import drill_statuses
from controlplane.refresh.models import DrillRun

register = template.Library()

HISTORY = 10

#: The render-context key of the drill statuses read once per page render.
_STATUSES = object()


@register.inclusion_tag("refresh/drill_status.html", takes_context=True)
def drill_status(context, source):
    """On the overview the first card reads every listed source's drills at once (two
    queries), kept for the rest of this render, so the page's cost does not grow with the
    number of sources; a lone card (a live push) reads its own."""
    return {
        "source": source,
        **source_badges.for_source(context, _STATUSES, source, drill_statuses),
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
