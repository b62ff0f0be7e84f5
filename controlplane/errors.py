"""Error pages inside the layout: 403 (and a failed CSRF check), 404 and 500.

403 and 404 render with the request, so the navigation and the signed-in user show as on any
page. 500 renders without the request: no context processor runs, so nothing touches the
session, the user or the database (either may be why we are here); the layout then shows no
user-dependent parts. If even that fails, a fixed plain page answers.
"""

from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse, HttpResponseServerError, JsonResponse
from django.shortcuts import render
from django.template import loader
from django.views.decorators.csrf import requires_csrf_token

logger = logging.getLogger(__name__)

_BARE_500 = (
    "<!doctype html><html lang=en><meta charset=utf-8><title>Server error</title>"
    "<h1>Server error</h1><p>Something went wrong on our side. It has been logged.</p></html>"
)


@requires_csrf_token
def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return render(request, "errors/403.html", {"reason": ""}, status=403)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    # `reason` is Django's fixed text (never the attacker's); shown to help a person retry.
    return render(request, "errors/403.html", {"csrf": True, "reason": reason}, status=403)


@requires_csrf_token
def page_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path.startswith("/api/"):
        # A path no API route matches (a path parameter Django's converter refused, say):
        # API clients get the API's own error shape, never an HTML page.
        error = {"code": "not_found", "message": "no API endpoint at this path", "details": None}
        return JsonResponse({"error": error}, status=404)
    return render(request, "errors/404.html", status=404)


def server_error(request: HttpRequest) -> HttpResponse:
    try:
        body = loader.get_template("errors/500.html").render({})
    except Exception:  # the template layer itself is broken: answer anyway
        logger.exception("the 500 page could not be rendered")
        body = _BARE_500
    return HttpResponseServerError(body)
