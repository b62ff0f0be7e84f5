"""Notifications through the intake app, when it is installed.

Imported lazily: refresh must not depend on intake at import time (intake builds on refresh).
"""

import logging

logger = logging.getLogger(__name__)


def notify(event: str, *, refresh=None, gate=None, reason: str = "") -> None:
    """Call inside the transaction; intake enqueues delivery on commit."""
    try:
        from controlplane.intake import notifications
    except ImportError:
        return
    notifications.notify(event, refresh=refresh, gate=gate, reason=reason)
