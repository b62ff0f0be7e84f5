"""The wrapper every API view gets: exempt from the login redirect and Django's CSRF middleware
(API auth does both itself), JSON bodies checked against the shared bounds before any view
runs, and unsafe calls made with a token leave an `api.request` row."""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.conf import settings
from django.http import HttpRequest, JsonResponse

from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import record
from controlplane.dynamo.jsonsafe import UnsafeJSON, loads_bounded
from controlplane.textlimits import QUOTED_CHARS

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: Signed endpoints check the signature before they look at the body (and audit refusals).
SIGNED_PATHS = ("/webhooks/trainer/",)


def _refuse_unsafe_json(request: HttpRequest) -> JsonResponse | None:
    """Every unsafe call's JSON body must parse within the bounds, even on endpoints that take
    no body: a body nested 100,000 deep or carrying NaN is refused before anything changes."""
    if request.method in SAFE_METHODS or any(p in request.path for p in SIGNED_PATHS):
        return None
    if "json" not in (request.content_type or "") or not request.body:
        return None
    try:
        loads_bounded(
            request.body,
            max_depth=settings.JSON_MAX_DEPTH,
            max_bytes=settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 2_621_440,
        )
    except UnsafeJSON as exc:
        status = 413 if exc.code == "payload_too_large" else 400
        error = {"code": exc.code, "message": f"request body: {exc.message}", "details": None}
        return JsonResponse({"error": error}, status=status)
    return None


def _audit_change(request: HttpRequest, response) -> None:
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
                "path": request.path[:QUOTED_CHARS],
                "status": response.status_code,
            },
        )


def machine_view(view):
    if iscoroutinefunction(view):
        # An async view (a long poll) stays async: wrapping it in a sync function would make
        # Django run the whole wait in a thread of its own.
        async def awaited(request: HttpRequest, *args, **kwargs):
            if request.method in SAFE_METHODS:  # neither a body to check nor an audit row
                return await view(request, *args, **kwargs)
            refusal = await sync_to_async(_refuse_unsafe_json)(request)
            response = refusal or await view(request, *args, **kwargs)
            await sync_to_async(_audit_change)(request, response)
            return response

        return _as_machine_view(awaited, view)

    def wrapped(request: HttpRequest, *args, **kwargs):
        response = _refuse_unsafe_json(request) or view(request, *args, **kwargs)
        _audit_change(request, response)
        return response

    return _as_machine_view(wrapped, view)


def _as_machine_view(wrapped, view):
    wrapped.csrf_exempt = True
    wrapped.login_required = False
    wrapped.__name__ = getattr(view, "__name__", "api_view")
    return wrapped
