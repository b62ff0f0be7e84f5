"""Admin actions for trainer integration: webhook endpoints and notification destinations.

One function per intent. Each validates first (raising `ValidationError` keyed by field, with
nothing changed), then writes the change and its audit row in one transaction. API tokens have
their own actions in `controlplane.accounts.tokens` (`create_token`, `revoke_token`); the views
call those directly rather than through a wrapper here.
"""

from controlplane.intake.services.destinations import (
    create_notification_destination,
    regenerate_destination_secret,
    remove_notification_destination,
    send_test_notification,
    update_notification_destination,
)
from controlplane.intake.services.endpoints import (
    MAX_SECRETS,
    add_webhook_secret,
    create_webhook_endpoint,
    remove_webhook_endpoint,
    remove_webhook_secret,
    secret_fingerprint,
    send_test_webhook_event,
    update_webhook_endpoint,
)

__all__ = [
    "MAX_SECRETS",
    "add_webhook_secret",
    "create_notification_destination",
    "create_webhook_endpoint",
    "regenerate_destination_secret",
    "remove_notification_destination",
    "remove_webhook_endpoint",
    "remove_webhook_secret",
    "secret_fingerprint",
    "send_test_notification",
    "send_test_webhook_event",
    "update_notification_destination",
    "update_webhook_endpoint",
]
