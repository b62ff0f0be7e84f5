"""The JSON API under `/api/v1/` assembled: one NinjaAPI, its routers, its error bodies and its
URLs (see the package's docstring).

Assembled here, not in the package's `__init__`: every module of the package runs that face
first, and the trainer webhook view (mounted below) imports the API's error schema, so an
`__init__` that mounted it would make an import cycle.
"""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.urls import re_path
from ninja import NinjaAPI

from controlplane.intake.api import (
    analyses,
    analysis_templates,
    audit,
    capacity,
    deliveries,
    drills,
    errors,
    gates,
    provenance,
    quarantines,
    refreshes,
    sources,
    workers,
)
from controlplane.intake.api.auth import API_AUTH
from controlplane.intake.api.docs import docs_view
from controlplane.intake.api.middleware import machine_view
from controlplane.intake.api.parser import BoundedJSONParser
from controlplane.intake.webhooks.trainer.view import router as trainer_webhooks

api = NinjaAPI(
    title="Dynamo RL control plane API",
    version="1",
    description=(
        "Sources, workers, observations, gates, policy refreshes, rollback drills and audit "
        "events of the Dynamo RL control plane; trainer webhooks. Errors are always "
        '`{"error": {"code", "message", "details"}}`.'
    ),
    urls_namespace="intake:api-v1",
    auth=API_AUTH,
    docs_url=None,
    parser=BoundedJSONParser(),
)
errors.install(api)
for module in (
    sources,
    workers,
    gates,
    quarantines,
    refreshes,
    drills,
    capacity,
    audit,
    deliveries,
    provenance,
    analyses,
    analysis_templates,
):
    api.add_router("", module.router)
api.add_router("", trainer_webhooks)


def _index(request: HttpRequest, **kwargs) -> JsonResponse:
    return JsonResponse({"openapi": request.path + "openapi.json", "docs": request.path + "docs"})


def _unknown(request: HttpRequest, **kwargs) -> JsonResponse:
    body = {"error": {"code": "not_found", "message": "no such API endpoint", "details": None}}
    return JsonResponse(body, status=404)


def urlpatterns() -> list:
    """The API's URL patterns: every view is a machine view (own auth, no login redirect)."""
    patterns, _, _ = api.urls
    for pattern in patterns:
        if getattr(pattern, "name", None) == "api-root":
            pattern.callback = _index
        pattern.callback = machine_view(pattern.callback)
    return [
        *patterns,
        re_path(r"^docs$", machine_view(docs_view(api)), name="docs"),
        re_path(r"^.*$", machine_view(_unknown)),
    ]
