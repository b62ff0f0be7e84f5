"""Admin actions for trainer integration: webhook endpoints. Notification destinations have
theirs in `controlplane.notify.services`.

One function per intent. Each validates first (raising `ValidationError` keyed by field, with
nothing changed), then writes the change and its audit row in one transaction. API tokens have
their own actions in `controlplane.accounts.tokens` (`create_token`, `revoke_token`); the views
call those directly rather than through a wrapper here.
"""

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
    "create_webhook_endpoint",
    "remove_webhook_endpoint",
    "remove_webhook_secret",
    "secret_fingerprint",
    "send_test_webhook_event",
    "update_webhook_endpoint",
]
