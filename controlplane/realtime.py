"""Publishing live events to browser and API subscribers.

Everything that pushes to websockets goes through `publish`, from sync code (services, Celery
tasks). Delivery is best effort by design: the Redis channel layer may drop messages, so every
consumer resynchronises from the database when it (re)connects. A publish failure is logged and
never breaks the change that caused it.
"""

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

logger = logging.getLogger(__name__)


def publish(group: str, event: str, payload: dict[str, Any] | None = None) -> None:
    """Send one typed event to a group. Consumers receive it as `{"type": "stream.event", ...}`."""
    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": "stream.event", "event": event, "payload": payload or {}}
    try:
        async_to_sync(layer.group_send)(group, message)
    except Exception:
        logger.warning("live event %s to %s was not delivered", event, group, exc_info=True)
