"""NUL (U+0000) in outside text is refused where it enters, with a 400 that says where.

PostgreSQL cannot store NUL in `text`, `varchar` or `jsonb`, and refuses it even as a query
parameter, so a NUL that reaches the ORM is a 500 (`/search/?q=%00`, a version path with
`%00`). Refuse, not escape: a request is written by someone who can read the answer and send
it again, and a value silently changed (NUL to U+FFFD) would be stored, audited and compared as
something the sender never wrote.

One mechanism for everything a request carries as text:

- `RefuseNulMiddleware` (early in MIDDLEWARE): the path, the query string, header values and
  form fields (urlencoded and multipart), before any view, form or URL converter sees them.
  Django's form `CharField`s already refuse NUL (`ProhibitNullCharactersValidator`), but URL
  converters, `request.GET` and hand-read POST fields are not forms.
- `refuse_nul_in_scope` (outermost in `controlplane/asgi.py`): the path and query string of
  what Django's middleware never sees — websocket handshakes (a stream's filters reach the
  ORM) and the gate polls `intake.api.fast_gate` answers in front of Django.
- JSON bodies (the API, trainer webhooks, JSON form fields): `dynamo.jsonsafe.loads_bounded`
  refuses a string or key with `\\u0000`, so each caller answers in its own error shape.

Data a Dynamo deployment sends (discovery payloads, worker replies) is checked by the Dynamo
client instead (`dynamo.limits`): an entry holding NUL is refused as that entry's problem,
and messages quoting outside text replace NUL with U+FFFD (`storable_text`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any
from urllib.parse import unquote_plus

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

NUL = "\x00"
#: The JSON API answers in its own error shape (`intake/api/errors.py`).
API_PREFIX = "/api/"
_FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def _any_nul(values: Iterable[str]) -> bool:
    return any(NUL in value for value in values)


def _nul_in_query(query: str) -> bool:
    return NUL in query or ("%00" in query and NUL in unquote_plus(query))


def nul_in_request(request: HttpRequest) -> str | None:
    """Which part of `request` holds a NUL ("path", "query string", "header", "form field"),
    or None. The form is read only for form content types (never a JSON or raw body)."""
    if NUL in request.path_info or NUL in request.path:
        return "path"
    if _nul_in_query(request.META.get("QUERY_STRING", "")):
        return "query string"
    if _any_nul(v for k, v in request.META.items() if k.startswith("HTTP_") and isinstance(v, str)):
        return "header"
    if request.method == "POST" and request.content_type in _FORM_TYPES:
        _keep_body_readable(request)
        for key, values in request.POST.lists():
            if NUL in key or _any_nul(values):
                return "form field"
        for field, files in request.FILES.lists():
            if NUL in field or _any_nul(f.name or "" for f in files):
                return "form field"
    return None


def _keep_body_readable(request: HttpRequest) -> None:
    """Read the raw body before the form, when Django would hold it in memory anyway.

    Parsing `request.POST` consumes the stream, after which `request.body` raises; views that
    read the raw bytes of a form-typed request (the API's idempotency fingerprint, a client
    that posts an empty multipart body) must still find them. A body over
    `DATA_UPLOAD_MAX_MEMORY_SIZE` is left streaming, as Django leaves it: only form parsing
    reads those, and it reads them from the stream.
    """
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if limit is None or int(request.META.get("CONTENT_LENGTH") or 0) <= limit:
        request.body  # noqa: B018 (cached on the request; the form then parses the copy)


def _message(where: str) -> str:
    return f"the request's {where} contains a NUL character (U+0000), which is not accepted"


def refusal(path: str, where: str) -> HttpResponse:
    """The 400: the API's error shape under /api/, plain text elsewhere."""
    response: HttpResponse
    if path.startswith(API_PREFIX):
        error = {"code": "nul_character", "message": _message(where), "details": {"where": where}}
        response = JsonResponse({"error": error}, status=400)
    else:
        body = _message(where) + "\n"
        response = HttpResponse(body, status=400, content_type="text/plain; charset=utf-8")
    # Also sent from the ASGI guard, in front of SecurityMiddleware: never sniffed as markup.
    response["X-Content-Type-Options"] = "nosniff"
    return response


class RefuseNulMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        where = nul_in_request(request)
        if where is not None:
            return refusal(request.path, where)
        return self.get_response(request)


Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]
#: A websocket refused before it opens: the handshake answers 403 (the ASGI spec's close
#: before accept); the code is for servers that pass it on.
WEBSOCKET_REFUSED = 4400


def nul_in_scope(scope: Scope) -> str | None:
    if NUL in scope.get("path", ""):
        return "path"
    if _nul_in_query(scope.get("query_string", b"").decode("latin-1")):
        return "query string"
    return None


def refuse_nul_in_scope(app: ASGIApp) -> ASGIApp:
    """The ASGI guard: an HTTP request answers as `refusal` would, a websocket is closed
    before it opens; everything else goes to `app` untouched."""

    async def guarded(scope: Scope, receive, send) -> None:
        where = nul_in_scope(scope) if scope["type"] in ("http", "websocket") else None
        if where is None:
            await app(scope, receive, send)
        elif scope["type"] == "websocket":
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": WEBSOCKET_REFUSED})
        else:
            response = refusal(scope["path"], where)
            headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.items()]
            await send({"type": "http.response.start", "status": 400, "headers": headers})
            await send({"type": "http.response.body", "body": response.content})

    return guarded
