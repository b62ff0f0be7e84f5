"""Admin tools under `/admin-tools/`: API tokens, webhook endpoints, notification destinations.

Small function views. Each object type has one access helper that checks the permission and
returns the object (or raises `PermissionDenied`/404); every mutating view is POST-only and goes
through a service, which writes the audit row.
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from controlplane.accounts.models import ApiToken
from controlplane.accounts.roles import Perm
from controlplane.fleet.models import Source
from controlplane.intake.models import WebhookEndpoint
from controlplane.intake.views.common import ADMIN_PERMS, HtmxHttpRequest
from controlplane.notify.models import NotificationDestination


@require_GET
def index(request: HtmxHttpRequest) -> HttpResponse:
    user = request.user
    if not any(user.has_perm(p) for p in ADMIN_PERMS):
        raise PermissionDenied
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
