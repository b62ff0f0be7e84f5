"""Is beat alive? Its schedule runs `ops.beat_heartbeat` every BEAT_HEARTBEAT_SECONDS, which
stores the time in the cache (Redis). A key older than BEAT_HEARTBEAT_STALE_INTERVALS of those
means beat stopped — or no worker ran the task; `doctor` checks workers separately, so the two
together tell which.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.core.cache import cache

KEY = "ops:beat-heartbeat"


def touch(now: float | None = None) -> None:
    cache.set(KEY, now if now is not None else time.time(), timeout=None)


def age_seconds(now: float | None = None) -> float | None:
    """Seconds since beat's last heartbeat, or None if there never was one."""
    last = cache.get(KEY)
    if last is None:
        return None
    return (now if now is not None else time.time()) - float(last)


def stale_after_seconds() -> float:
    return settings.BEAT_HEARTBEAT_SECONDS * settings.BEAT_HEARTBEAT_STALE_INTERVALS
