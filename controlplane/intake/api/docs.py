"""A server-rendered API reference built from the OpenAPI schema (no CDN, no JavaScript)."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from ninja import NinjaAPI

METHODS = ("get", "post", "put", "patch", "delete")


def docs_view(api: NinjaAPI) -> Callable[[HttpRequest], HttpResponse]:
    """The reference page of `api` (given, not imported: the API's module builds its URLs)."""

    def api_docs(request: HttpRequest) -> HttpResponse:
        return render(request, "intake/api_docs.html", _context(api))

    return api_docs


def _context(api: NinjaAPI) -> dict:
    schema = api.get_openapi_schema()
    operations = []
    for path, item in schema["paths"].items():
        for method in METHODS:
            if method not in item:
                continue
            op = item[method]
            operations.append(
                {
                    "method": method.upper(),
                    "path": path,
                    "summary": op.get("summary", ""),
                    "description": op.get("description", ""),
                    "tags": op.get("tags", []),
                    "parameters": op.get("parameters", []),
                    "has_body": "requestBody" in op,
                    "responses": sorted(op.get("responses", {})),
                }
            )
    operations.sort(key=lambda o: (o["tags"][:1], o["path"], o["method"]))
    return {"info": schema["info"], "operations": operations, "schema_url": "openapi.json"}
