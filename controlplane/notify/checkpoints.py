"""Audit checkpoints as notifications: the receiver of audit's `checkpoint_appended` signal.

Opt-in only (a destination with no event filter does not get it): a checkpoint every few
minutes would drown a chat channel.
"""

from __future__ import annotations

import logging
from dataclasses import asdict

from controlplane.audit.anchors import CHECKPOINT_EVENT, Checkpoint
from controlplane.notify.emit import enqueue_delivery
from controlplane.notify.models import NotificationDelivery, NotificationDestination

logger = logging.getLogger(__name__)


def post_checkpoint(sender, *, checkpoint: Checkpoint, **_kwargs) -> int:
    """Queue the checkpoint to destinations that subscribe to `audit.checkpoint` by name.
    Returns how many. Never raises: the anchor file is the primary sink."""
    try:
        payload = {
            "type": CHECKPOINT_EVENT,
            "title": "Audit checkpoint",
            "timestamp": checkpoint.time,
            "data": {
                "reason": f"audit chain head #{checkpoint.sequence}",
                "checkpoint": asdict(checkpoint),
            },
        }
        destinations = [
            d
            for d in NotificationDestination.objects.filter(enabled=True)
            if CHECKPOINT_EVENT in (d.events or [])
        ]
        for destination in destinations:
            delivery = NotificationDelivery.objects.create(
                destination=destination, event=CHECKPOINT_EVENT, payload=payload
            )
            enqueue_delivery(delivery.pk)
        return len(destinations)
    except Exception:
        logger.exception("audit checkpoint #%s could not be queued", checkpoint.sequence)
        return 0
