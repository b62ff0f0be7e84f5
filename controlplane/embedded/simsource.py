"""The demo's source for its simulated fleet: registered (or brought up to date) once the fleet
answers, and read back to see its first discovery.

Its own module so `manage.py demo` imports the fleet app in one place, late: only once the
embedded Redis is up and the settings point at it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from controlplane.audit.recorder import Actor
from controlplane.fleet import services
from controlplane.fleet.models import Source

__all__ = ["first_discovery", "register"]


def register(name: str, values: dict[str, Any]) -> int:
    """Create the source `name` with `values`, or update it where it differs; its id."""
    actor = Actor.system("demo")
    source = Source.objects.filter(name=name).first()
    if source is None:
        source = services.create_source(actor=actor, name=name, **values)
    elif any(getattr(source, k) != v for k, v in values.items()):
        services.update_source(source, actor=actor, **values)
    return source.pk


def first_discovery(source_id: int, since: datetime) -> str | None:
    """How the first discovery that finished after `since` went ("ok" or "stale: why"), or
    None while there is none."""
    source = Source.objects.get(pk=source_id)
    finished = source.last_discovery_finished_at
    if finished is None or finished < since:
        return None
    return "stale: " + source.stale_reason if source.stale else "ok"
