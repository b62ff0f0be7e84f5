"""The listener's per-worker probe and descriptor validation (contract §1.4 to 1.5).

The simulated request plane is a function call: the worker's descriptor (its first `routes`
data chunk) is produced in-process, with probe faults applied, then validated with exactly the
checks and error strings of the real `dynamo_rl` crate.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

U32_MAX = 2**32 - 1


class ProbeError(Exception):
    """The probe failed; `str(exc)` is the listener entry's `error`."""


def _admin_base_url_problem(raw: str) -> str | None:
    """Why an `admin_base_url` is rejected, or None when it is acceptable."""
    url = raw.strip()
    if not url:
        return "RL admin base URL must not be blank"
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises on a malformed port
    except ValueError as exc:
        return f"invalid RL admin base URL: {exc}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "RL admin base URL must use HTTP or HTTPS and include a host"
    if parts.username is not None or parts.password is not None:
        return "RL admin base URL must not include user information"
    if parts.query or url.rstrip("#").endswith("?"):
        return "RL admin base URL must not include a query string"
    if parts.fragment or "#" in url:
        return "RL admin base URL must not include a fragment"
    return None


def validate_descriptor(chunk: Any) -> dict[str, Any]:
    """Turn the worker's first data chunk into entry fields, or raise `ProbeError`.

    Returns `routes` (sorted, deduplicated) and, when present, `system_url`,
    `admin_base_url` and `world_size`. Check order follows the real listener.
    """
    if not isinstance(chunk, dict):
        raise ProbeError("worker routes response missing 'routes' array")
    if chunk.get("status") == "error":
        message = chunk.get("message")
        raise ProbeError(message if isinstance(message, str) else "worker routes request failed")
    routes = chunk.get("routes")
    if not isinstance(routes, list):
        raise ProbeError("worker routes response missing 'routes' array")
    for route in routes:
        if not isinstance(route, str):
            raise ProbeError("worker routes response contains a non-string route entry")
        if not route:
            raise ProbeError("worker routes response contains an empty route entry")
    fields: dict[str, Any] = {"routes": sorted(set(routes))}

    system_url = chunk.get("system_url")
    if isinstance(system_url, str) and system_url.strip():
        fields["system_url"] = system_url.strip()

    admin = chunk.get("admin_base_url")
    if admin is not None:
        if not isinstance(admin, str):
            raise ProbeError("worker routes response has invalid 'admin_base_url'")
        problem = _admin_base_url_problem(admin)
        if problem:
            raise ProbeError(f"worker routes response has invalid 'admin_base_url': {problem}")
        fields["admin_base_url"] = admin.strip()  # a trailing slash is kept

    world_size = chunk.get("world_size")
    if world_size is not None:
        if isinstance(world_size, bool) or not isinstance(world_size, int):
            raise ProbeError("worker routes response has invalid 'world_size'")
        if not 0 < world_size <= U32_MAX:
            raise ProbeError("worker routes response has invalid 'world_size'")
        fields["world_size"] = world_size
    if "admin_base_url" in fields and "world_size" not in fields:
        raise ProbeError("worker routes response has 'admin_base_url' without valid 'world_size'")
    return fields
