"""Typed requests: what our middleware and API authentication add to Django's HttpRequest.

Views annotate their request with one of these so the attributes are checked by mypy instead
of being set and read on a bare `HttpRequest` by convention.

`client_address` is who sent a request, for everything that acts on it (audit source_ip,
the login throttle, /metrics' allowed networks).
"""

from __future__ import annotations

import functools
import ipaddress
from typing import TYPE_CHECKING

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
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


_Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@functools.lru_cache(maxsize=8)
def _networks(entries: tuple[str, ...]) -> tuple[_Network, ...]:
    networks: list[_Network] = []
    for entry in entries:
        if entry == "*":
            networks += [ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")]
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ImproperlyConfigured(
                f"TRUSTED_PROXIES: {entry!r} is not an IP address or network"
            ) from None
    return tuple(networks)


def _address(text: str) -> _Address | None:
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        return None


def trusted_proxy(address: _Address) -> bool:
    return any(address in network for network in _networks(tuple(settings.TRUSTED_PROXIES)))


def client_address(request: HttpRequest) -> str | None:
    """The address of whoever sent `request`.

    The peer (REMOTE_ADDR), unless the peer is one of `TRUSTED_PROXIES`: then X-Forwarded-For
    is read from the right, each trusted proxy having appended the address it saw, and the
    first address that is not a trusted proxy is the client. Anything left of it was written by
    the client and is ignored, so a forged `X-Forwarded-For: 127.0.0.1` from anywhere else
    changes nothing. The same rule as uvicorn's `--forwarded-allow-ips`, so it holds whether or
    not uvicorn already rewrote the peer (it reads the same list, FORWARDED_ALLOW_IPS).
    """
    peer = _address(request.META.get("REMOTE_ADDR") or "")
    if peer is None:
        return None
    if not trusted_proxy(peer):
        return str(peer)
    hops = [hop for hop in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if hop.strip()]
    client = peer
    for hop in reversed(hops):
        address = _address(hop)
        if address is None:  # not an address a proxy wrote: believe nothing further left
            break
        client = address
        if not trusted_proxy(address):
            break
    return str(client)
