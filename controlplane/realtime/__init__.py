"""Live events: publishing them to browser and API subscribers, and the consumer base.

Everything that pushes to websockets goes through `publish`, from sync code (services, Celery
tasks); every websocket consumer is a `LiveStream`. Delivery is best effort by design: the
channel layer drops a message nobody is subscribed to at that moment, and a full or failing
publisher drops frames, so every consumer resynchronises from the database when it
(re)connects. A publish failure is logged and never breaks the change that caused it.

`publish` hands the event to the process's one long-lived publisher (`publisher.py`) and
returns at once; `flush` waits until what was published has been sent (tests, and exit). On
the receiving side each server process subscribes once per group and renders, encodes and
writes each event for all its sockets itself (`fanout.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from typing import Any

from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers

from controlplane.realtime.fanout import Versioned
from controlplane.realtime.publisher import FLUSH_TIMEOUT_SECONDS, next_event_id, process_publisher
from controlplane.realtime.streams import REFUSED, LiveStream

__all__ = ["REFUSED", "LiveStream", "Versioned", "flush", "publish"]

logger = logging.getLogger(__name__)


def publish(
    group: str,
    event: str,
    payload: dict[str, Any] | None = None,
    *,
    coalesce_key: Hashable | None = None,
) -> None:
    """Send one typed event to a group, without waiting. Consumers receive it as
    `{"type": "stream.event", "event", "payload", "id"}`.

    `coalesce_key` marks an event that a newer one with the same key makes obsolete (per-call
    progress of one refresh, say `("progress", refresh_id)`): such events go out at most a few
    times per second per key, the newest winning. Events without one are never coalesced or
    dropped for rate, and never overtake a coalescible event published before them.
    """
    try:
        if DEFAULT_CHANNEL_LAYER not in channel_layers.configs:
            return
        message = {
            "type": "stream.event",
            "event": event,
            "payload": payload or {},
            "id": next_event_id(),
        }
        process_publisher().submit(group, message, coalesce_key)
    except Exception:  # e.g. no thread can start while the interpreter shuts down
        logger.warning("live event %s to %s was not queued", event, group, exc_info=True)


def flush(timeout: float = FLUSH_TIMEOUT_SECONDS) -> bool:
    """Wait until every event published so far is sent; False if that took over `timeout`."""
    return process_publisher().flush(timeout)
