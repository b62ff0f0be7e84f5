"""What every admin-tools view shares: the typed htmx request and the admin permissions."""

from __future__ import annotations

from django.http import HttpResponse
from django.utils.cache import add_never_cache_headers

from controlplane.accounts.roles import Perm

#: Any one of these opens the admin-tools index (matches the nav link in base.html).
ADMIN_PERMS = (Perm.MANAGE_SOURCES, Perm.MANAGE_TOKENS, Perm.MANAGE_WEBHOOKS)


def secret_response(response: HttpResponse) -> HttpResponse:
    """A page showing a secret once must not be kept by the browser or a proxy."""
    add_never_cache_headers(response)
    return response
