"""Who is calling: a bearer token or a signed-in browser session (with CSRF), and what they
may see. Endpoints call `require` for permissions and the source helpers for scoping."""

from __future__ import annotations

from typing import Any, cast

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest
from django.utils.functional import SimpleLazyObject
from ninja.errors import AuthenticationError
from ninja.security import APIKeyCookie, HttpBearer
from ninja.utils import check_csrf

from controlplane.accounts import tokens
from controlplane.accounts.models import ApiToken
from controlplane.accounts.roles import Perm
from controlplane.audit.recorder import Actor, actor_from_request
from controlplane.fleet.models import Source
from controlplane.requests import ApiRequest


class BearerToken(HttpBearer):
    """`Authorization: Bearer cpt_...`. A present but bad header is refused outright, so a
    revoked token never silently falls back to a browser session."""

    def __call__(self, request: HttpRequest):
        header = request.headers.get("Authorization")
        if not header:
            return None
        scheme, _, secret = header.partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise AuthenticationError(401, "Authorization must be 'Bearer <token>'")
        return self.authenticate(request, secret.strip())

    def authenticate(self, request: HttpRequest, token: str):
        grant = tokens.grant_for(token)
        if grant is None:
            raise AuthenticationError(401, "the token is unknown, expired or revoked")
        api = cast(ApiRequest, request)
        api.grant = grant
        api.token_source_ids = None if grant.source_ids is None else set(grant.source_ids)
        # Permissions and sources come from the grant (`require`, `token_source_ids`); the
        # token row and its user are loaded only by the endpoints that use them (changes,
        # audit), so a gate poll answered from Redis makes no query at all.
        rows = ApiToken.objects.select_related("user")
        row = SimpleLazyObject(lambda: rows.get(pk=grant.token_id))
        api.api_token = cast(ApiToken, row)
        api.user = cast(Any, SimpleLazyObject(lambda: row.user))
        api.audit_actor = cast(Actor, SimpleLazyObject(lambda: Actor.for_token(row)))
        return grant


class BrowserSession(APIKeyCookie):
    """The signed-in user's session cookie; unsafe methods must carry the CSRF token."""

    param_name = "sessionid"

    def _get_key(self, request: HttpRequest):
        key = request.COOKIES.get(self.param_name)
        if key and request.method not in ("GET", "HEAD", "OPTIONS") and check_csrf(request):
            raise AuthenticationError(403, "CSRF check failed")
        return key

    def authenticate(self, request: HttpRequest, key):
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return None
        api = cast(ApiRequest, request)
        api.api_token = None
        api.grant = None
        return user


API_AUTH = [BearerToken(), BrowserSession()]


def require(request: HttpRequest, perm: Perm) -> None:
    grant = getattr(request, "grant", None)
    allowed = grant.allows(perm) if grant is not None else request.user.has_perm(perm)
    if not allowed:
        raise PermissionDenied(f"this needs the {perm.codename} permission")


def token_source_ids(request: HttpRequest) -> set[int] | None:
    """The sources a limited token may touch, or None when not limited (cached per request)."""
    api = cast(ApiRequest, request)
    if not hasattr(api, "token_source_ids"):
        api.token_source_ids = tokens.allowed_source_ids(getattr(api, "api_token", None))
    return api.token_source_ids


def visible_sources(request: HttpRequest):
    sources = Source.objects.all()
    limit = token_source_ids(request)
    return sources if limit is None else sources.filter(pk__in=limit)


def source_or_404(request: HttpRequest, name: str) -> Source:
    source = visible_sources(request).filter(name=name).first()
    if source is None:
        raise Http404(f"no source {name!r}")
    return source


def limit_to_sources(request: HttpRequest, queryset, field: str = "source"):
    """Filter a queryset of source-owned rows to what the caller may see."""
    limit = token_source_ids(request)
    return queryset if limit is None else queryset.filter(**{f"{field}__in": limit})


def require_unlimited(request: HttpRequest) -> None:
    """Fleet-wide operations (creating sources, reading the whole audit log) are refused to
    tokens limited to some sources."""
    if token_source_ids(request) is not None:
        raise PermissionDenied("this token is limited to some sources")


def actor(request: HttpRequest) -> Actor:
    return actor_from_request(request)
