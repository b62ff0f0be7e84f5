"""Outbound URL policy: the only gate between discovery data and a request on the network.

Dynamo's admin routes have no authentication, and `system_url` comes from whatever a worker
advertised. Before any request (listener, worker admin, frontend) the URL must use http/https,
carry no userinfo, and have a host whose *every* resolved address lies inside the networks the
operator allowed for that source. An empty allowlist allows nothing: a forgotten setting must
fail closed, not open to the cloud metadata service.

Known limit: the check resolves the name, then aiohttp resolves it again when connecting, so a
hostile DNS server could rebind between the two. Sources should use IP literals or names served
by a trusted resolver; see the note in docs/reference/dynamo-client-api.md.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import re
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlsplit

from .errors import OutboundPolicyError, one_line

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str], list[str]]

ALLOWED_SCHEMES = frozenset({"http", "https"})
#: Scheme and authority of a plain http(s) URL (see `OutboundPolicy._memo_key`).
_PLAIN_ORIGIN = re.compile(r"(https?)://([^/?#]*)")


def system_resolver(host: str) -> list[str]:
    """All addresses `host` resolves to (IPv4 and IPv6), as the OS resolver sees them."""
    infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    # IPv6 entries carry (host, port, flowinfo, scope_id); the host is always the text form.
    return sorted({str(info[4][0]) for info in infos})


def _parse_address(text: str) -> IPAddress:
    # getaddrinfo may return scoped IPv6 (`fe80::1%eth0`); the scope does not change the network.
    addr = ipaddress.ip_address(text.split("%", 1)[0])
    # `::ffff:169.254.169.254` reaches the IPv4 host, so judge it as that IPv4 address.
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


# A pure function of the host text: a refresh checks thousands of URLs on a few hundred
# distinct IP literals, and parsing one costs more than the rest of the check.
@functools.lru_cache(maxsize=4096)
def _literal_host(host: str) -> IPAddress | None:
    try:
        return _parse_address(host)
    except ValueError:
        return None


#: Verdicts one policy remembers before starting over (a fleet has far fewer hosts).
MEMO_LIMIT = 4096
_MISSING = object()


@dataclass(frozen=True, slots=True)
class OutboundPolicy:
    """The networks one source may reach. Compare/hash ignore the resolver (a test seam).

    Verdicts that need no DNS (an IP-literal host, or a URL refused before any lookup) depend
    only on the URL's scheme and authority, so each policy remembers them by that pair: a
    refresh checks thousands of URLs on the same few hundred hosts. Verdicts for host names
    are remembered only by a policy made for one run (`for_run`); otherwise each check
    resolves again, as the DNS answer may change.
    """

    allowed_networks: tuple[IPNetwork, ...]
    resolver: Resolver = field(default=system_resolver, compare=False, repr=False)
    #: Remember verdicts on host names too (a policy made by `for_run`).
    remember_names: bool = field(default=False, compare=False, repr=False)
    _memo: dict[tuple[str, str], str | None] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )
    #: Verdicts by exact `system_url` string (see `admin_violation`).
    _bases: dict[str, str | None] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    @classmethod
    def from_cidrs(cls, cidrs: Iterable[str], resolver: Resolver | None = None) -> OutboundPolicy:
        """Build from CIDR strings such as `10.0.0.0/8` or `127.0.0.1/32`.

        Raises ValueError naming the bad entry; host bits set (`10.0.0.1/8`) are an error
        because they usually mean a typo.
        """
        networks: list[IPNetwork] = []
        for raw in cidrs:
            text = str(raw).strip()
            if not text:
                raise ValueError("empty CIDR entry in allowed networks")
            try:
                networks.append(ipaddress.ip_network(text, strict=True))
            except ValueError as exc:
                raise ValueError(f"invalid CIDR {text!r}: {exc}") from None
        return cls(tuple(networks), resolver or system_resolver)

    @classmethod
    def parse_cidrs(cls, raw: object) -> list[str]:
        """CIDRs from a list or a comma/whitespace separated string, validated and normalised.

        Raises ValueError naming the problem. An empty list is refused rather than accepted
        as "allow nothing", because a caller asking for one almost always forgot it.
        """
        if isinstance(raw, str):
            items = [p for p in re.split(r"[\s,]+", raw) if p]
        elif isinstance(raw, Iterable):
            items = [str(p).strip() for p in raw]
        else:
            raise ValueError("must be a list of CIDRs")
        if not items:
            raise ValueError("at least one CIDR is required: an empty list allows nothing")
        return [str(net) for net in cls.from_cidrs(items).allowed_networks]

    def for_run(self) -> OutboundPolicy:
        """This policy for one refresh run: every verdict, host names included, is judged
        once per URL origin and remembered until the run ends.

        The allowlist is data that does not change during a run (a new one applies from the
        next run), so the only thing a re-check could catch is a DNS answer changing mid-run —
        the rebinding the module docstring already names as a known limit: a second lookup
        here would not close it, since aiohttp resolves again when it connects.
        """
        return OutboundPolicy(self.allowed_networks, self.resolver, remember_names=True)

    def _allowed(self, addr: IPAddress) -> bool:
        return any(addr.version == net.version and addr in net for net in self.allowed_networks)

    def _static_violation(self, url: str) -> tuple[str | None, str | None]:
        """Checks that need no DNS. Returns (violation, host)."""
        if not self.allowed_networks:
            return "no networks are allowed for this source (empty allowlist)", None
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError for a non-numeric or out-of-range port
        except ValueError as exc:
            return f"invalid URL: {exc}", None
        scheme = parts.scheme.lower()
        if scheme not in ALLOWED_SCHEMES:
            return f"scheme {scheme or '(none)'!r} is not allowed; use http or https", None
        if "@" in parts.netloc:
            return "URL must not include user information", None
        host = parts.hostname
        if not host:
            return "URL has no host", None
        return None, host

    def _judge_literal(self, host: str, addr: IPAddress) -> str | None:
        """`_judge(host, [str(addr)])` for an already parsed literal."""
        if not self._allowed(addr):
            return f"host {host!r} resolves to {addr}, outside the allowed networks"
        return None

    def _judge(self, host: str, addresses: list[str]) -> str | None:
        if not addresses:
            return f"host {host!r} resolved to no addresses"
        for text in addresses:
            try:
                addr = _parse_address(text)
            except ValueError:
                return f"host {host!r} resolved to unparseable address {text!r}"
            if not self._allowed(addr):
                return f"host {host!r} resolves to {addr}, outside the allowed networks"
        return None

    def _memo_key(self, url: str) -> tuple[str, str] | None:
        # A printable ASCII URL with a lowercase http(s) scheme splits exactly as urlsplit
        # splits it (nothing to strip, the authority ends at the first `/`, `?` or `#`):
        # thousands of distinct worker URLs a run, each split once, cost more than the check.
        if url.isascii() and url.isprintable() and " " not in url:
            plain = _PLAIN_ORIGIN.match(url)
            if plain is not None:
                return plain.group(1), plain.group(2)
        try:
            parts = urlsplit(url)
        except ValueError:
            return None
        return parts.scheme, parts.netloc

    def _without_dns(self, url: str) -> tuple[bool, str | None, str | None]:
        """(decided, verdict, host): the verdict when no DNS lookup is needed, else the host."""
        key = self._memo_key(url)
        if key is not None and key in self._memo:
            return True, self._memo[key], None
        problem, host = self._static_violation(url)
        if problem or host is None:
            verdict = problem
        else:
            literal = _literal_host(host)
            if literal is None:
                return False, None, host
            verdict = self._judge_literal(host, literal)
        if key is not None:
            self._remember(self._memo, key, verdict)
        return True, verdict, None

    def violation(self, url: str) -> str | None:
        """Why `url` may not be called, or None when it may. Blocks on DNS for host names."""
        decided, verdict, host = self._without_dns(url)
        if decided or host is None:
            return verdict
        try:
            addresses = self.resolver(host)
        except (OSError, UnicodeError) as exc:
            verdict = f"host {host!r} does not resolve: {one_line(exc, 200)}"
        else:
            verdict = self._judge(host, addresses)
        key = self._memo_key(url)
        if self.remember_names and key is not None:
            self._remember(self._memo, key, verdict)
        return verdict

    @staticmethod
    def _remember(memo: dict[Any, str | None], key: object, verdict: str | None) -> None:
        if len(memo) >= MEMO_LIMIT:
            memo.clear()
        memo[key] = verdict

    async def aviolation(self, url: str) -> str | None:
        """`violation` for async callers: IP literals inline, DNS names off the event loop."""
        decided, verdict, _host = self._without_dns(url)
        if decided:
            return verdict
        return await asyncio.to_thread(self.violation, url)

    async def admin_violation(self, system_url: str) -> str | None:
        """The verdict for every admin URL of a worker: `system_url` with `/<route>` appended.

        Judged on the prefix `system_url.rstrip("/") + "/"`, which every admin URL starts with
        (`dynamo.admin.admin_url`). A URL's scheme, user information, host and port all lie
        before the first `/`, `?` or `#` after `//`, and the prefix already contains that
        delimiter, so nothing appended can change them: one verdict stands for all of the
        worker's calls. Remembered by the exact `system_url` string (no parsing per call)
        under the same rule as every verdict: always without DNS, host names only in a run.
        """
        known = self._bases.get(system_url, _MISSING)
        if known is not _MISSING:
            return cast("str | None", known)
        prefix = system_url.rstrip("/") + "/"
        decided, verdict, _host = self._without_dns(prefix)
        if not decided:
            verdict = await asyncio.to_thread(self.violation, prefix)
            if not self.remember_names:
                return verdict
        self._remember(self._bases, system_url, verdict)
        return verdict

    def check(self, url: str) -> None:
        """Raise OutboundPolicyError when `url` may not be called."""
        problem = self.violation(url)
        if problem is not None:
            raise OutboundPolicyError(url, problem)
