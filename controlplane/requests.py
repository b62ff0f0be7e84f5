"""Typed requests: what our middleware and API authentication add to Django's HttpRequest.

Views annotate their request with one of these so the attributes are checked by mypy instead
of being set and read on a bare `HttpRequest` by convention.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.http import HttpRequest
from django_htmx.middleware import HtmxDetails

if TYPE_CHECKING:  # types only: every app may import this module, whatever its layer
    from controlplane.accounts.models import ApiToken
    from controlplane.accounts.tokens import Grant
    from controlplane.audit.recorder import Actor


class HtmxHttpRequest(HttpRequest):
    """A request that went through django-htmx's middleware (every page request does)."""

    htmx: HtmxDetails


class ApiRequest(HttpRequest):
    """A request authenticated by the JSON API (`controlplane.intake.api.auth`).

    `api_token` is the bearer token (None for a browser session), `grant` what it may do
    (`accounts.tokens.Grant`, cached: permissions and sources); `audit_actor` is who the
    audit log names for changes made with it; `token_source_ids` caches the sources a limited
    token may touch (None when unlimited).
    """

    api_token: ApiToken | None
    grant: Grant | None
    audit_actor: Actor
    token_source_ids: set[int] | None
