"""Failed-login throttling per (username, client address), kept in the shared cache.

Keyed on both so one attacker cannot lock a colleague out from elsewhere, and one address
cannot cycle through usernames faster than the limit allows per name.
"""

import hashlib

from django.conf import settings
from django.core.cache import cache


def _key(username: str, ip: str | None) -> str:
    digest = hashlib.sha256(f"{username.lower()}|{ip or '-'}".encode()).hexdigest()[:32]
    return f"login-failures:{digest}"


def is_throttled(username: str, ip: str | None) -> bool:
    return cache.get(_key(username, ip), 0) >= settings.LOGIN_THROTTLE_ATTEMPTS


def note_failure(username: str, ip: str | None) -> int:
    key = _key(username, ip)
    cache.add(key, 0, timeout=settings.LOGIN_THROTTLE_WINDOW_SECONDS)
    try:
        return cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.set(key, 1, timeout=settings.LOGIN_THROTTLE_WINDOW_SECONDS)
        return 1


def clear(username: str, ip: str | None) -> None:
    cache.delete(_key(username, ip))
