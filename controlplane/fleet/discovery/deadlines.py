"""How long a read of the RL listener may take.

The listener answers only when its slowest probe has answered or hit its per-worker deadline
(`DYN_RL_REQUEST_TIMEOUT_SECS`, 30 s by default; contract §1.4). A reader with a shorter
deadline turns one hung worker into a failed discovery that names nobody (a spurious hold);
one that waits past the listener's deadline gets the listing, where the hung worker carries
its own `worker discovery timed out` error and is named.
"""

from __future__ import annotations

from django.conf import settings


def listener_read_timeout(call_timeout: float = 0.0) -> float:
    """How long a read of `/v1/rl/workers` may take: past the listener's own per-worker
    deadline (`DYN_RL_REQUEST_TIMEOUT_SECS`, 30 s by default), which one hung worker makes it
    wait out. A shorter read would turn one hung probe into a failed discovery that names
    nobody; this one gets the listing, where the hung worker carries its timeout error.

    `DISCOVERY_LISTENER_TIMEOUT_SECONDS` (35 s) is set above the listeners' deadline; an
    executor's admin-call timeout is for worker calls and never shortens a listener read."""
    return max(call_timeout, settings.DISCOVERY_LISTENER_TIMEOUT_SECONDS)
