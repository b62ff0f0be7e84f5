"""The wrapper every API view gets: exempt from the login redirect and Django's CSRF middleware
(API auth does both itself), and unsafe calls made with a token leave an `api.request` row."""

from __future__ import annotations

from django.http import HttpRequest

from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import record

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def machine_view(view):
    def wrapped(request: HttpRequest, *args, **kwargs):
        response = view(request, *args, **kwargs)
        token = getattr(request, "api_token", None)
        # Reads are not audited: gate polls every second would drown the log. Changes made by
        # a token are, whatever their outcome, so a refused attempt is on record too.
        if token is not None and request.method not in SAFE_METHODS:
            record(
                AuditAction.API_REQUEST,
                request=request,
                target=token,
                details={
                    "method": request.method,
                    "path": request.path[:300],
                    "status": response.status_code,
                },
            )
        return response

    wrapped.csrf_exempt = True
    wrapped.login_required = False
    wrapped.__name__ = getattr(view, "__name__", "api_view")
    return wrapped
