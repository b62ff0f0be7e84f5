"""What every admin-tools view shares: the typed htmx request, the admin permissions, and how
a secret is shown once."""

from __future__ import annotations

import base64
import binascii
import secrets
import time
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.utils.cache import add_never_cache_headers

from controlplane.accounts.roles import Perm

#: Any one of these opens the admin-tools index (matches the nav link in base.html).
ADMIN_PERMS = (Perm.MANAGE_SOURCES, Perm.MANAGE_TOKENS, Perm.MANAGE_WEBHOOKS)

#: A secret created by a POST is shown by the GET it redirects to (post/redirect/get: a reload
#: never creates a second one), once. Between the two it is split: the session holds it
#: XOR-ed with a random pad of its length, the browser holds the pad in a cookie scoped to the
#: admin pages. Neither alone reveals a bit of it, so it never rests in the session store in
#: clear (a token's secret is otherwise stored only as a hash). The GET takes both and drops
#: both; an entry not taken within ONE_TIME_SECONDS is refused.
ONE_TIME_SESSION_KEY = "intake.one_time_secret"
ONE_TIME_COOKIE = "cp_one_time_pad"
ONE_TIME_COOKIE_PATH = "/admin-tools/"
ONE_TIME_SECONDS = 600


def secret_response(response: HttpResponse) -> HttpResponse:
    """A page showing a secret once must not be kept by the browser or a proxy."""
    add_never_cache_headers(response)
    return response


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode()


def stash_secret(
    request: HttpRequest, response: HttpResponse, *, kind: str, pk: int, secret: str, **extra: Any
) -> HttpResponse:
    """Keep `secret` for the one GET `response` redirects to (see ONE_TIME_SESSION_KEY)."""
    data = secret.encode()
    pad = secrets.token_bytes(len(data))
    request.session[ONE_TIME_SESSION_KEY] = {
        "kind": kind,
        "pk": pk,
        "masked": _b64(bytes(a ^ b for a, b in zip(data, pad, strict=True))),
        "at": time.time(),
        "extra": extra,
    }
    response.set_cookie(
        ONE_TIME_COOKIE,
        _b64(pad),
        max_age=ONE_TIME_SECONDS,
        path=ONE_TIME_COOKIE_PATH,
        secure=request.is_secure(),
        httponly=True,
        samesite="Strict",
    )
    return secret_response(response)


def take_secret(request: HttpRequest, *, kind: str, pk: int) -> tuple[str, dict] | None:
    """The stashed secret of this object and what came with it, once; None when there is none
    (a reload, another object's, too old, or the cookie is gone)."""
    entry = request.session.get(ONE_TIME_SESSION_KEY)
    if not entry or entry.get("kind") != kind or entry.get("pk") != pk:
        return None
    del request.session[ONE_TIME_SESSION_KEY]
    if time.time() - float(entry.get("at", 0)) > ONE_TIME_SECONDS:
        return None
    try:
        masked = base64.urlsafe_b64decode(entry["masked"])
        pad = base64.urlsafe_b64decode(request.COOKIES.get(ONE_TIME_COOKIE, ""))
    except (binascii.Error, ValueError, KeyError):
        return None
    if len(pad) != len(masked):
        return None
    try:
        secret = bytes(a ^ b for a, b in zip(masked, pad, strict=True)).decode()
    except UnicodeDecodeError:
        return None
    return secret, dict(entry.get("extra") or {})


def shown_once(response: HttpResponse) -> HttpResponse:
    """The page that showed a stashed secret: not cached, and the pad cookie dropped."""
    response.delete_cookie(ONE_TIME_COOKIE, path=ONE_TIME_COOKIE_PATH, samesite="Strict")
    return secret_response(response)
