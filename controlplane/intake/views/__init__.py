"""Admin tools under `/admin-tools/`: API tokens, webhook endpoints, notification destinations.

Small function views. Each checks its permission with `@requires`; each object type has one
access helper that returns the object (or 404); every mutating view is POST-only and goes
through a service, which writes the audit row.
"""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from controlplane.accounts.access import requires
from controlplane.accounts.models import ApiToken
from controlplane.accounts.roles import Perm
from controlplane.fleet.models import Source
from controlplane.intake.models import WebhookEndpoint
from controlplane.intake.views.common import ADMIN_PERMS
from controlplane.notify.models import NotificationDestination
from controlplane.requests import HtmxHttpRequest

__all__ = ["index"]


@require_GET
@requires(*ADMIN_PERMS)
def index(request: HtmxHttpRequest) -> HttpResponse:
    user = request.user
    context = {
        "can_sources": user.has_perm(Perm.MANAGE_SOURCES),
        "can_tokens": user.has_perm(Perm.MANAGE_TOKENS),
        "can_webhooks": user.has_perm(Perm.MANAGE_WEBHOOKS),
        "sources": Source.objects.order_by("name").only("pk", "name", "enabled", "stale"),
        "token_count": ApiToken.objects.filter(revoked_at__isnull=True).count(),
        "endpoint_count": WebhookEndpoint.objects.count(),
        "destination_count": NotificationDestination.objects.count(),
    }
    return render(request, "intake/admin_index.html", context)
